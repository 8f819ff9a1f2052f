#!/usr/bin/env bash
set -euo pipefail
cd /app
cat > cleanup.sh <<'EOF'
#!/bin/bash
# usage: cleanup.sh DIR DAYS
DIR=$1
DAYS=$2
count=0
for f in $(find $DIR -name *.tmp -mtime +$DAYS); do
    rm $f
    count=$((count+1))
done
echo "removed $count files"
EOF
chmod +x cleanup.sh
