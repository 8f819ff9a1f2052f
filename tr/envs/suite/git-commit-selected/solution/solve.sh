#!/usr/bin/env bash

cd /app/repo && git status --short

git add src && git commit -q -m "Add greeting utility" && git status --short && git log --oneline
