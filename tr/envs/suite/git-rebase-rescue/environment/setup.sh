#!/usr/bin/env bash
set -euo pipefail
cd /app
export GIT_CONFIG_NOSYSTEM=1
git init -q -b main repo
cd repo
git config user.name "Dev Eloper"
git config user.email dev@example.com
git config commit.gpgsign false
git config advice.detachedHead false

printf '%s' 'TIMEOUT = 10


def connect(host):
    return "connect %s timeout=%d" % (host, TIMEOUT)
' > app.py
printf '# app\n' > README.md
git add -A && git commit -q -m "Initial commit"
git checkout -q -b feature
printf '[net]\nretries = 3\n' > settings.ini
git add -A && git commit -q -m "Add settings file"
printf '%s' 'TIMEOUT = 10


def connect(host, retries=3):
    return "connect %s timeout=%d retries=%d" % (host, TIMEOUT, retries)
' > app.py
git add -A && git commit -q -m "Add retries to connect"
printf 'from app import connect\n\n\ndef test_connect():\n    assert connect("db").startswith("connect db timeout=")\n' > test_app.py
git add -A && git commit -q -m "Add tests"
git checkout -q main
printf '%s' 'TIMEOUT_S = 30


def connect(host):
    return "connect %s timeout=%d" % (host, TIMEOUT_S)
' > app.py
git add -A && git commit -q -m "Rename timeout constant"
git checkout -q feature
printf '\nRetries: set `retries` in settings.ini (default 3).\n' >> README.md
git stash -q
git rebase main >/dev/null 2>&1 && exit 1 || true
test -d .git/rebase-merge
: > .git/index.lock
