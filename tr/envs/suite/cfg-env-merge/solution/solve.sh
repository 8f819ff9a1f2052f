#!/usr/bin/env bash

cat /app/env/*.env

cat > /tmp/merge_env.py <<'EOF'
import re
merged = {}
for name in ("defaults", "production", "local"):
    for raw in open("/app/env/%s.env" % name):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        merged[key] = value
with open("/app/.env", "w") as f:
    for key in sorted(merged):
        v = merged[key]
        f.write('%s="%s"\n' % (key, v) if (" " in v or "#" in v or v == "") else "%s=%s\n" % (key, v))
EOF
python3 /tmp/merge_env.py && cat /app/.env
