#!/usr/bin/env bash
set -euo pipefail
cd /app
cat > crontab <<'EOF'
# crontab for the app user
MAILTO=ops@example.com
SHELL=/bin/sh
# m h dom mon dow command
30 2 * * 0 /opt/app/bin/backup.sh
0 6 * * 1-5 /opt/app/bin/report.sh
15 * * * * /opt/app/bin/rotate.sh
0 4 * 1 * /opt/app/bin/cleanup.sh
5 8-20 * * * /opt/app/bin/sync.sh
EOF
