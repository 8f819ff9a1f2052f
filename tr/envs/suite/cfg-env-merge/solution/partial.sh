#!/usr/bin/env bash

python3 - <<'EOF'
merged = {}
for name in ("defaults", "production", "local"):
    for raw in open("/app/env/%s.env" % name):
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.replace("export ", "", 1).partition("=")
            merged[key.strip()] = value.strip().strip("'\"")
open("/app/.env", "w").writelines("%s=%s\n" % kv for kv in sorted(merged.items()))
EOF
