#!/usr/bin/env bash

cat > /app/runjobs.sh <<'EOF'
#!/usr/bin/env bash
usage() { echo "usage: runjobs.sh -j N JOBFILE" >&2; exit 2; }
[ "${1:-}" = "-j" ] && [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] && [ $# -eq 3 ] && [ -f "$3" ] || usage
n=$2
jobfile=$3
logs="$(dirname "$jobfile")/logs"
mkdir -p "$logs"
declare -A running=()
ok=0; failed=0
reap() {
    local pid
    for pid in "${!running[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null || [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = "Z" ]; then
            if wait "$pid"; then ok=$((ok + 1)); else failed=$((failed + 1)); fi
            unset "running[$pid]"
        fi
    done
}
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    [[ -z "${line//[[:space:]]/}" || "$line" =~ ^[[:space:]]*# ]] && continue
    while [ "${#running[@]}" -ge "$n" ]; do
        wait -n 2>/dev/null
        reap
    done
    bash -c "$line" > "$logs/$lineno.log" 2>&1 < /dev/null &
    running[$!]=1
done < "$jobfile"
while [ "${#running[@]}" -gt 0 ]; do
    wait -n 2>/dev/null
    reap
done
echo "ok $ok failed $failed"
[ "$failed" -eq 0 ]
EOF
chmod +x /app/runjobs.sh

mkdir -p /tmp/rj && printf 'echo one\n\n# c\nfalse\nsleep 0.2; echo three\n' > /tmp/rj/jobs && /app/runjobs.sh -j 2 /tmp/rj/jobs; ls /tmp/rj/logs; rm -rf /tmp/rj
