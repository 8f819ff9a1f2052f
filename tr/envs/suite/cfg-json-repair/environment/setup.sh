#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p config
cat > config/service.json <<'EOF'
// service configuration (edited by hand)
{
  'name': "billing-api",
  "listen": "0.0.0.0:8443",
  "docs_url": "https://docs.example.com/billing", // public docs
  "workers": "8",            // must be a number
  "log_level": "INFO",
  "timeouts": {
    "read": "30s",
    "write": "45s",
    "idle": 120,
  },
  "features": ["audit", "metrics",],
  /* TLS settings
     (rotated yearly) */
  "tls": {"enabled": true, "cert": "/etc/ssl/billing.pem"},
}
EOF
cat > config/validate.py <<'EOF'
import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "/app/config/service.json"
try:
    cfg = json.load(open(path))
except ValueError as e:
    sys.exit("invalid JSON: %s" % e)
problems = []
if not isinstance(cfg.get("workers"), int) or not 1 <= cfg["workers"] <= 64:
    problems.append("workers must be an integer between 1 and 64")
if cfg.get("log_level") not in ("debug", "info", "warning", "error"):
    problems.append("log_level must be one of debug, info, warning, error")
for k, v in cfg.get("timeouts", {}).items():
    if not isinstance(v, int):
        problems.append("timeouts.%s must be an integer number of seconds" % k)
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
EOF
