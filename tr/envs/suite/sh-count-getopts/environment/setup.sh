#!/usr/bin/env bash
set -euo pipefail
cd /app
printf 'INFO start\nerror: disk\nInfo again\nERROR: net\n' > sample.log
