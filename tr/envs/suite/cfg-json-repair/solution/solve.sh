#!/usr/bin/env bash

cat /app/config/service.json; python3 /app/config/validate.py; echo "validate exit status $?"

cat > /app/config/service.json <<'EOF'
{
  "name": "billing-api",
  "listen": "0.0.0.0:8443",
  "docs_url": "https://docs.example.com/billing",
  "workers": 8,
  "log_level": "info",
  "timeouts": {
    "read": 30,
    "write": 45,
    "idle": 120
  },
  "features": ["audit", "metrics"],
  "tls": {"enabled": true, "cert": "/etc/ssl/billing.pem"}
}
EOF

python3 /app/config/validate.py && echo valid
