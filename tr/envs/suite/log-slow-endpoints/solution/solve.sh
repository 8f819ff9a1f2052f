#!/usr/bin/env bash

cd /app && { echo 'endpoint,count,avg_ms'; awk '{ m = substr($6, 2); p = $7; sub(/\?.*/, "", p); k = m " " p; n[k]++; s[k] += $NF } END { for (k in n) { a = 1000 * s[k] / n[k]; if (a > 250) printf "%s,%d,%.1f\n", k, n[k], a } }' timing.log | sort -t, -k3,3nr; } > slow.csv && cat slow.csv
