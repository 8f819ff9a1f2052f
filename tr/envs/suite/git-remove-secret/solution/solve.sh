#!/usr/bin/env bash

cd /app/repo && git log --stat --oneline | head -n 20

git rm -q --cached secrets.env && printf 'secrets.env\n' > .gitignore && git add .gitignore && git commit -q --amend --no-edit && git log --stat --oneline | head -n 12 && git status --short
