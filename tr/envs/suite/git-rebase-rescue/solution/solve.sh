#!/usr/bin/env bash

cd /app/repo && git status; git stash list; ls .git

rm -f .git/index.lock && git diff

cat > app.py <<'EOF'
TIMEOUT_S = 30
def connect(host, retries=3):
    return "connect %s timeout=%d retries=%d" % (host, TIMEOUT_S, retries)
EOF

git add app.py && GIT_EDITOR=true git rebase --continue && git log --oneline --graph --all

git stash pop && git add README.md && git commit -q -m "Document retries" && git status --short && git stash list && git log --oneline -n 6
