#!/usr/bin/env bash

cd /app/repo && git merge feature; git checkout --theirs greet.py && git add greet.py && git commit -q --no-edit
