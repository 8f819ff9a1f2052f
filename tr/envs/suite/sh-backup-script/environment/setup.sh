#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p data/reports
printf 'q1\n' > data/reports/q1.txt
printf 'hello\n' > data/readme.txt
