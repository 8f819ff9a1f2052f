#!/usr/bin/env bash

cat > /app/daemon <<'EOF'
#!/usr/bin/env bash
state=$1
message=$(sed -n 's/^message=//p' "$state/config")
echo "running reloads=0 message=$message" > "$state/status"
trap 'echo "stopped reloads=0" > "$state/status"; exit 0' TERM
while true; do sleep 0.05; done
EOF
chmod +x /app/daemon
