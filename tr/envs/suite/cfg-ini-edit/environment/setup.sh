#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p config
cat > config/app.ini <<'EOF'
; Application configuration
; managed by hand - keep comments
[server]
host = 0.0.0.0
port = 8080
; workers = 2

[database]
host = localhost
port = 5432
name = shop
; pool size tuned in 2023
pool = 10

[cache]
enabled = true
ttl = 300
EOF
