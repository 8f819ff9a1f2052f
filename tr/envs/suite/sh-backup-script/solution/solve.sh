#!/usr/bin/env bash

cat > /app/backup.sh <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
if [ $# -ne 2 ] || [ ! -d "$1" ]; then
    echo "usage: backup.sh SRC_DIR DEST_DIR (SRC_DIR must be a directory)" >&2
    exit 1
fi
src="$(cd "$1" && pwd)"
name="$(basename "$src")"
mkdir -p "$2"
tar -C "$(dirname "$src")" -czf "$2/$name.tar.gz" "$name"
EOF
chmod +x /app/backup.sh && /app/backup.sh /app/data /tmp/bk && tar -tzf /tmp/bk/data.tar.gz
