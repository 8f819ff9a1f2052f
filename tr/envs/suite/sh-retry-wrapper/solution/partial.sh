#!/usr/bin/env bash

cat > /app/retry.sh <<'EOF'
#!/usr/bin/env bash
n=$2
d=$4
shift 5
for i in $(seq 1 "$n"); do
    "$@" && exit 0
    sleep "$d"
done
exit 1
EOF
chmod +x /app/retry.sh
