#!/usr/bin/env bash

cd /app/photos && for f in *; do [ -f "$f" ] || continue; case "$(printf '%s' "$f" | tr 'A-Z' 'a-z')" in *.jpg|*.jpeg) n=$(printf '%s' "$f" | grep -o '[0-9]\{4\}' | head -n1); [ "$f" = "photo_$n.jpg" ] || mv -n -- "$f" "photo_$n.jpg";; esac; done

ls -la /app/photos
