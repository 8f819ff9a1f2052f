#!/usr/bin/env bash

cat > /app/config/service.json <<'EOF'
{
  "name": "billing-api",
  "listen": "0.0.0.0:8443",
  "docs_url": "https://docs.example.com/billing",
  "workers": "8",
  "log_level": "INFO",
  "timeouts": {"read": "30s", "write": "45s", "idle": 120},
  "features": ["audit", "metrics"],
  "tls": {"enabled": true, "cert": "/etc/ssl/billing.pem"}
}
EOF
