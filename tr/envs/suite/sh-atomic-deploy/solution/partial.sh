#!/usr/bin/env bash

cat > /app/deploy.sh <<'EOF'
#!/bin/bash
root=${DEPLOY_ROOT:-/app/srv}
name=$(basename "$1" .tar.gz)
mkdir -p "$root/releases/$name"
tar -xzf "$1" -C "$root/releases/$name"
rm -f "$root/current"
ln -s "releases/$name" "$root/current"
EOF
chmod +x /app/deploy.sh
