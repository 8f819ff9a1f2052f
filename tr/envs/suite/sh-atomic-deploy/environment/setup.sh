#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p srv
cat > srv/README <<'EOF'
Releases used to be deployed by hand: untar into releases/, then "rm current; ln -s ...".
EOF
