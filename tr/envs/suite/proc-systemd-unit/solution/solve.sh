#!/usr/bin/env bash

cat /app/etc/systemd/system/webhook.service

cat > /app/etc/systemd/system/webhook.service <<'EOF'
[Unit]
Description=Webhook receiver
Wants=network-online.target
After=network-online.target
[Service]
ExecStart=/opt/webhook/bin/webhook --port 9000
WorkingDirectory=/opt/webhook
User=webhook
Group=webhook
Environment=LOG_LEVEL=info
Restart=on-failure
RestartSec=3
[Install]
WantedBy=multi-user.target
EOF
