#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p etc/systemd/system
cat > etc/systemd/system/webhook.service <<'EOF'
[Unit]
Description=Webhook receiver
After=network.target

[service]
ExecStart=bin/webhook --port 9000
WorkingDirectory=/opt/webhook
User=root
Restart=yes
Environment=LOG_LEVEL=debug
EOF
