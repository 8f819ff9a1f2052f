#!/usr/bin/env bash

cat > /app/tb.py <<'EOF'
import json, re
from collections import Counter
lines = open("/app/app.log").read().splitlines()
finals = [l.split(":")[0] for i, l in enumerate(lines) if re.match(r"[A-Za-z_][\w.]*: ", l) and (i + 1 == len(lines) or re.match(r"\d{4}-", lines[i + 1]))]
json.dump({k: {"count": v} for k, v in Counter(finals).items()}, open("/app/exceptions.json", "w"))
EOF
python3 /app/tb.py
