#!/usr/bin/env bash

cat > /app/svc/svc.sh <<'EOF'
#!/usr/bin/env bash
RUN=${SVC_RUN_DIR:-/app/svc/run}
PIDFILE=$RUN/worker.pid
WORKER=/app/svc/worker.py
mkdir -p "$RUN"
is_worker() {
    [[ "$1" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status"
}
running_pid() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    is_worker "$pid" && echo "$pid"
}
do_start() {
    local pid
    if pid=$(running_pid); then echo "already running (pid $pid)"; return 0; fi
    rm -f "$PIDFILE" "$RUN/heartbeat"
    setsid python3 "$WORKER" >>"$RUN/worker.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" > "$PIDFILE.tmp" && mv -f "$PIDFILE.tmp" "$PIDFILE"
    for _ in $(seq 100); do
        if [ -f "$RUN/heartbeat" ]; then echo "started (pid $pid)"; return 0; fi
        state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
        [ -z "$state" ] || [ "$state" = Z ] && break
        sleep 0.05
    done
    echo "svc.sh: worker failed to start" >&2
    rm -f "$PIDFILE"
    return 1
}
do_stop() {
    local pid
    if ! pid=$(running_pid); then rm -f "$PIDFILE"; echo "not running"; return 0; fi
    kill -TERM "$pid" 2>/dev/null
    local steps
    steps=$(awk -v t="${STOP_TIMEOUT:-5}" 'BEGIN { print int(t * 20) + 1 }')
    for _ in $(seq "$steps"); do is_worker "$pid" || break; sleep 0.05; done
    rm -f "$PIDFILE"
    echo "stopped"
}
case "${1:-}" in
    start) do_start ;;
    stop) do_stop ;;
    status) if pid=$(running_pid); then echo "running (pid $pid)"; exit 0; else echo "stopped"; exit 3; fi ;;
    restart) do_stop >/dev/null; do_start ;;
    *) echo "usage: svc.sh start|stop|status|restart" >&2; exit 2 ;;
esac
EOF
chmod +x /app/svc/svc.sh
