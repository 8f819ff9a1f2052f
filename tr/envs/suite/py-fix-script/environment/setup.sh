#!/usr/bin/env bash
set -euo pipefail
cd /app
cat > tool.py <<'EOF'
import sys

total = 0
for arg in sys.argv[1:]:
    total += int(arg)
print total
EOF
chmod 644 tool.py
