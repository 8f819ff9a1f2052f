#!/usr/bin/env bash

cd /app/repo && rm -f .git/index.lock

cat > app.py <<'EOF'
TIMEOUT_S = 30
def connect(host, retries=3):
    return "connect %s timeout=%d retries=%d" % (host, TIMEOUT_S, retries)
EOF

git add app.py && GIT_EDITOR=true git rebase --continue
