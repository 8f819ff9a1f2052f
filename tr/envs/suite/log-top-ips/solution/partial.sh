#!/usr/bin/env bash

cd /app && awk '{ print $1 }' access.log | sort | uniq -c | sort -rn | head -n 5 > top_ips.txt
