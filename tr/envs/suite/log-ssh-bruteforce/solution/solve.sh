#!/usr/bin/env bash

cat > /app/offenders.py <<'EOF'
import json, re
from collections import defaultdict
FAIL = re.compile(r"Failed password for (?:invalid user )?(\S+) from (\S+)")
fails = defaultdict(list)
for line in open("/app/auth.log"):
    m = FAIL.search(line)
    if not m:
        continue
    hh, mm, ss = map(int, line.split()[2].split(":"))
    t = hh * 3600 + mm * 60 + ss
    rep = re.search(r"message repeated (\d+) times", line)
    for _ in range(int(rep.group(1)) if rep else 1):
        fails[m.group(2)].append((t, m.group(1)))
out = []
for ip in sorted(fails):
    times = sorted(t for t, _ in fails[ip])
    if any(times[i + 4] - times[i] <= 600 for i in range(len(times) - 4)):
        t = times[0]
        out.append({"ip": ip, "failures": len(times), "users": sorted({u for _, u in fails[ip]}),
                    "first_seen": "2024-03-03T%02d:%02d:%02d" % (t // 3600, t % 3600 // 60, t % 60)})
json.dump(out, open("/app/offenders.json", "w"), indent=2)
EOF
python3 /app/offenders.py && cat /app/offenders.json
