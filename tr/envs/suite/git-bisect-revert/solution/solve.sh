#!/usr/bin/env bash

cd /app/repo && git bisect start HEAD "$(git rev-list --max-parents=0 HEAD)" && git bisect run ./check.sh

git rev-parse refs/bisect/bad > /app/first_bad.txt && git bisect reset && cat /app/first_bad.txt

git revert --no-edit "$(cat /app/first_bad.txt)" && ./check.sh && git status --short && git log --oneline -n 3
