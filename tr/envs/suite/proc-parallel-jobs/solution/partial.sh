#!/usr/bin/env bash

cat > /app/runjobs.sh <<'EOF'
#!/usr/bin/env bash
jobfile=$3
logs="$(dirname "$jobfile")/logs"
mkdir -p "$logs"
ok=0; failed=0; lineno=0
while IFS= read -r line; do
    lineno=$((lineno + 1))
    [[ -z "$line" || "$line" == \#* ]] && continue
    if bash -c "$line" > "$logs/$lineno.log" 2>&1 < /dev/null; then ok=$((ok + 1)); else failed=$((failed + 1)); fi
done < "$jobfile"
echo "ok $ok failed $failed"
[ "$failed" -eq 0 ]
EOF
chmod +x /app/runjobs.sh
