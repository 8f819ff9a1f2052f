#!/usr/bin/env bash

mkdir -p /app/chapters && awk '/^CHAPTER [0-9]+: / { n = $2; sub(":", "", n); f = sprintf("/app/chapters/%02d.txt", n) } f { print > f }' /app/book.txt

cd /app/chapters && { printf 'number\ttitle\twords\n'; for f in [0-9][0-9].txt; do head -n1 "$f" | sed -E 's/^CHAPTER ([0-9]+): (.*)$/\1\t\2/' | tr -d '\n'; printf '\t%s\n' "$(wc -w < "$f")"; done; } > index.tsv && cat index.tsv
