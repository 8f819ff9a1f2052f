#!/usr/bin/env bash

cd /app/repo && git bisect start HEAD "$(git rev-list --max-parents=0 HEAD)" && git bisect run ./check.sh

git rev-parse refs/bisect/bad > /app/first_bad.txt && git bisect reset
