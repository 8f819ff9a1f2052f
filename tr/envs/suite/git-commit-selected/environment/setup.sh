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

mkdir src
printf 'from util import greet\n\nprint(greet("world"))\n' > src/app.py
printf 'def greet(name):\n    return "hi " + name\n' > src/legacy.py
printf 'todo: nothing\n' > notes.txt
git add -A && git commit -q -m "Initial commit"
printf 'from util import greet\n\nprint(greet("world", excited=True))\n' > src/app.py
printf 'def greet(name, excited=False):\n    return "hello " + name + ("!" if excited else "")\n' > src/util.py
printf 'todo: ask Bob about the release\n' >> notes.txt
