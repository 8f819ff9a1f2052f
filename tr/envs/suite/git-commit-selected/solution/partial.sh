#!/usr/bin/env bash

cd /app/repo && git add -A && git commit -q -m "Add greeting utility"
