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

printf '%s' 'def greet(name):
    return "Hello, " + name + "!"
' > greet.py
git add -A && git commit -q -m "Add greet"
git checkout -q -b feature
printf '%s' 'def greet(name, shout=False):
    text = "Hello, " + name + "!"
    return text.upper() if shout else text
' > greet.py
printf 'shout=True upper-cases the greeting\n' > FEATURE.md
git add -A && git commit -q -m "Add shout option"
git checkout -q main
printf '%s' 'def greet(name, punctuation="!"):
    return "Hello, " + name + punctuation
' > greet.py
git add -A && git commit -q -m "Add punctuation option"
