#!/usr/bin/env bash

cd /app/docs && { echo 'path,emails,ips'; find . -type f -not -path './legal/*' | sed 's|^\./||' | LC_ALL=C sort | while read -r f; do e=$(grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}' "$f" | wc -l); i=$(grep -oE '\b([0-9]{1,3}\.){3}[0-9]{1,3}\b' "$f" | wc -l); [ $((e+i)) -gt 0 ] && echo "$f,$e,$i"; done; } > /app/redaction_report.csv; cat /app/redaction_report.csv

cd /app/docs && find . -type f -not -path './legal/*' -exec sed -i -E -e 's/[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}/[EMAIL]/g' -e 's/\b([0-9]{1,3}\.){3}[0-9]{1,3}\b/[IP]/g' {} +

grep -rn 'EMAIL\|IP\]' /app/docs
