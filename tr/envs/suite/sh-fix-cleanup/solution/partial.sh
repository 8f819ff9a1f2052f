#!/usr/bin/env bash

cat > /app/cleanup.sh <<'EOF'
#!/bin/bash
usage() { echo "usage: cleanup.sh DIR DAYS" >&2; exit 2; }
[ $# -eq 2 ] || usage
[[ "$2" =~ ^[0-9]+$ ]] || usage
[ -d "$1" ] || usage
count=0
while IFS= read -r -d '' f; do
    rm -f -- "$f" && count=$((count + 1))
done < <(find "$1" -type f -name '*.tmp' -mtime +"$2" -print0)
echo "removed $count files"
EOF
