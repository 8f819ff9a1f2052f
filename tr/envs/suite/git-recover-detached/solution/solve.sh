#!/usr/bin/env bash

cd /app/repo && git reflog | head -n 20

git branch rescue "$(git log -g --format='%H %s' HEAD | awk '$2 == "Fix" && $3 == "parser" {print $1; exit}')" && git log --oneline -n 3 rescue

git merge --no-edit rescue && git log --oneline --graph && git status --short
