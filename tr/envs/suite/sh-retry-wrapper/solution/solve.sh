#!/usr/bin/env bash

cat > /app/retry.sh <<'EOF'
#!/usr/bin/env bash
attempts=3
delay=1
while getopts ":n:d:" opt; do
    case "$opt" in
        n) attempts=$OPTARG ;;
        d) delay=$OPTARG ;;
        *) echo "usage: retry.sh [-n ATTEMPTS] [-d DELAY] -- COMMAND [ARGS...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || { echo "usage: retry.sh [-n ATTEMPTS] [-d DELAY] -- COMMAND [ARGS...]" >&2; exit 2; }
status=0
for ((k = 1; k <= attempts; k++)); do
    "$@"
    status=$?
    [ "$status" -eq 0 ] && exit 0
    echo "attempt $k/$attempts failed with status $status" >&2
    [ "$k" -lt "$attempts" ] && sleep "$delay"
done
exit "$status"
EOF
chmod +x /app/retry.sh && /app/retry.sh -n 2 -d 0 -- sh -c 'exit 3'; echo "status $?"
