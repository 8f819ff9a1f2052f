#!/usr/bin/env bash

cd /app && printf '{"total": %d, "client_errors": %d, "server_errors": %d}\n' "$(wc -l < access.log)" "$(grep -c ' 4[0-9][0-9] ' access.log)" "$(grep -c ' 5[0-9][0-9] ' access.log)" > summary.json
