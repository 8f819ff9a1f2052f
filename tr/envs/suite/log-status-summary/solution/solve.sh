#!/usr/bin/env bash

cd /app && awk '{ total++; s = $9; if (s ~ /^4/) c++; if (s ~ /^5/) e++ } END { printf "{\"total\": %d, \"client_errors\": %d, \"server_errors\": %d}\n", total, c, e }' access.log > summary.json && cat summary.json
