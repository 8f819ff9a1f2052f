#!/usr/bin/env bash

cat > /app/svc/svc.sh <<'EOF'
#!/bin/bash
RUN=${SVC_RUN_DIR:-/app/svc/run}
mkdir -p "$RUN"
case "$1" in
    start)
        nohup python3 /app/svc/worker.py >> "$RUN/worker.log" 2>&1 &
        echo $! > "$RUN/worker.pid"
        echo "started (pid $!)" ;;
    stop)
        kill -KILL "$(cat "$RUN/worker.pid")" && rm -f "$RUN/worker.pid"
        echo "stopped" ;;
    status)
        if [ -f "$RUN/worker.pid" ] && kill -0 "$(cat "$RUN/worker.pid")" 2>/dev/null; then echo "running (pid $(cat "$RUN/worker.pid"))"; else echo "stopped"; exit 3; fi ;;
    restart)
        "$0" stop; "$0" start ;;
esac
EOF
chmod +x /app/svc/svc.sh
