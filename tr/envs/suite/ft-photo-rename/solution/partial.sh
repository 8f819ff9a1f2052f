#!/usr/bin/env bash

cd /app/photos && for f in *.JPG; do n=$(printf '%s' "$f" | grep -o '[0-9]\{4\}'); mv -- "$f" "photo_$n.jpg"; done
