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

printf '# tools\n' > README.md
git add -A && git commit -q -m "Initial commit"
printf 'def add(a, b):\n    return a + b\n' > util.py
git add -A && git commit -q -m "Add util"
git checkout -q --detach
printf 'def parse(line):\n    return line.split(",")\n' > parser.py
git add -A && git commit -q -m "Add parser"
printf 'def parse(line):\n    return [x.strip() for x in line.split(",") if x.strip()]\n' > parser.py
git add -A && git commit -q -m "Fix parser edge case"
git checkout -q main
git checkout -q --detach
printf 'scratch\n' > experiment.txt
git add -A && git commit -q -m "Experiment: do not keep"
git checkout -q main
printf '# tools\n\nSmall helpers.\n' > README.md
git add -A && git commit -q -m "Update docs"
