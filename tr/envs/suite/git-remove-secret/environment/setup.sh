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

printf '# demo app\n' > README.md
git add -A && git commit -q -m "Initial commit"
printf 'print("app")\n' > app.py
git add -A && git commit -q -m "Add app entry point"
printf 'import os\n\ndef load():\n    return dict(line.split("=", 1) for line in open("secrets.env").read().split())\n' > config.py
printf 'DB_PASSWORD=hunter2\nAPI_TOKEN=tok_live_8f2a\n' > secrets.env
git add -A && git commit -q -m "Add config loader"
