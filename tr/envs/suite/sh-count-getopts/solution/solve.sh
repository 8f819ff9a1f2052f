#!/usr/bin/env bash

cat > /app/count.sh <<'EOF'
#!/usr/bin/env bash
usage() { echo "usage: count.sh [-i] [-v] PATTERN FILE..." >&2; exit 2; }
flags=(-F)
while getopts ":iv" opt; do
    case "$opt" in
        i) flags+=(-i) ;;
        v) flags+=(-v) ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || usage
pattern="$1"; shift
total=0; status=0
for f in "$@"; do
    if [ ! -f "$f" ]; then
        echo "count.sh: $f: no such file" >&2; status=1; continue
    fi
    n=$(grep -c "${flags[@]}" -e "$pattern" -- "$f")
    echo "$f: $n"
    total=$((total + n))
done
echo "total: $total"
exit "$status"
EOF
chmod +x /app/count.sh && cd /app && ./count.sh -i error sample.log; ./count.sh -iv error sample.log nope.log; echo "status $?"
