#!/usr/bin/env bash

cat > /app/offenders.py <<'EOF'
import json, re
from collections import defaultdict
FAIL = re.compile(r"Failed password for (?:invalid user )?(\S+) from (\S+)")
fails = defaultdict(list)
for line in open("/app/auth.log"):
    m = FAIL.search(line)
    if m:
        hh, mm, ss = map(int, line.split()[2].split(":"))
        fails[m.group(2)].append((hh * 3600 + mm * 60 + ss, m.group(1)))
out = []
for ip in sorted(fails):
    ts = sorted(t for t, _ in fails[ip])
    if any(ts[i + 4] - ts[i] <= 600 for i in range(len(ts) - 4)):
        out.append({"ip": ip, "failures": len(ts), "users": sorted({u for _, u in fails[ip]})})
json.dump(out, open("/app/offenders.json", "w"), indent=2)
EOF
python3 /app/offenders.py
