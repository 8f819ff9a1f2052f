#!/usr/bin/env bash

cat > /app/supervise.sh <<'EOF'
#!/usr/bin/env bash
max=3
backoff=1
while getopts ":r:b:" opt; do
    case "$opt" in
        r) max=$OPTARG ;;
        b) backoff=$OPTARG ;;
        *) echo "usage: supervise.sh [-r MAX_RESTARTS] [-b BACKOFF] -- COMMAND [ARGS...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || { echo "usage: supervise.sh [-r MAX_RESTARTS] [-b BACKOFF] -- COMMAND [ARGS...]" >&2; exit 2; }
child=""
sleeper=""
on_term() {
    [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    exit 143
}
trap on_term TERM
restarts=0
while true; do
    "$@" &
    child=$!
    wait "$child" 2>/dev/null
    status=$?
    while kill -0 "$child" 2>/dev/null; do wait "$child" 2>/dev/null; status=$?; done
    child=""
    [ "$status" -eq 0 ] && exit 0
    [ "$restarts" -ge "$max" ] && exit "$status"
    restarts=$((restarts + 1))
    echo "restart $restarts after exit $status" >&2
    delay=$(awk -v b="$backoff" -v k="$restarts" 'BEGIN { printf "%.3f", b * 2 ^ (k - 1) }')
    sleep "$delay" &
    sleeper=$!
    wait "$sleeper"
    sleeper=""
done
EOF
chmod +x /app/supervise.sh

/app/supervise.sh -r 2 -b 0.1 -- sh -c 'exit 3'; echo "status $?"
