#!/usr/bin/env bash

cat > /app/supervise.sh <<'EOF'
#!/usr/bin/env bash
max=$2
shift 5
restarts=0
while true; do
    "$@"
    status=$?
    [ "$status" -eq 0 ] && exit 0
    [ "$restarts" -ge "$max" ] && exit "$status"
    restarts=$((restarts + 1))
    echo "restart $restarts after exit $status" >&2
done
EOF
chmod +x /app/supervise.sh
