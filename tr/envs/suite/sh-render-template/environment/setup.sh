#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p templates
cat > templates/motd.tpl <<'EOF'
Welcome to ${HOST}, ${USER_NAME}!
Prices start at $5. Literal: $${HOST}
EOF
