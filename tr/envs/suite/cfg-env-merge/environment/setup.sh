#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p env
cat > env/defaults.env <<'EOF'
# defaults for every environment
APP_NAME=shop
LOG_LEVEL=info
DB_HOST=localhost
DB_PORT=5432
GREETING="Hello there"
FEATURE_X=off
EOF
cat > env/production.env <<'EOF'
export DB_HOST=db.prod.internal
LOG_LEVEL=warning
   # tuned
WORKERS=8
FEATURE_X = 'on'
SENTRY_DSN=
LOG_LEVEL=error
EOF
cat > env/local.env <<'EOF'

DB_PORT=6543
EMPTY_OK=""
MOTTO='ship it #fast'
export WORKERS=2
EOF
