#!/usr/bin/env bash

cd /app && { echo 'endpoint,count,avg_ms'; awk '{ m = substr($6, 2); p = $7; sub(/\?.*/, "", p); k = m " " p; n[k]++; s[k] += $NF } END { for (k in n) printf "%s,%d,%.1f\n", k, n[k], 1000 * s[k] / n[k] }' timing.log | sort -t, -k3,3nr; } > slow.csv
