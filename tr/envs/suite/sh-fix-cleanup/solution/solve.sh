#!/usr/bin/env bash

cat /app/cleanup.sh

cat > /app/cleanup.sh <<'EOF'
#!/bin/bash
# usage: cleanup.sh DIR DAYS
usage() { echo "usage: cleanup.sh DIR DAYS" >&2; exit 2; }
[ $# -eq 2 ] || usage
DIR=$1
DAYS=$2
[[ "$DAYS" =~ ^[0-9]+$ ]] || usage
[ -d "$DIR" ] || usage
count=0
while IFS= read -r -d '' f; do
    rm -f -- "$f" && count=$((count + 1))
done < <(find "$DIR" -type f -name '*.tmp' -mmin +$((DAYS * 1440)) -print0)
echo "removed $count files"
EOF

mkdir -p /tmp/t/sub && touch -d '3 days ago' '/tmp/t/a b.tmp' && touch -d '36 hours ago' /tmp/t/sub/c.tmp && touch /tmp/t/new.tmp && /app/cleanup.sh /tmp/t 1 && ls -R /tmp/t; /app/cleanup.sh /tmp/t x; echo "status $?"
