#!/usr/bin/env bash

cat > /app/tb.py <<'EOF'
import json, re
stats, current_ts, last_exc = {}, None, None
def close():
    if current_ts and last_exc:
        s = stats.setdefault(last_exc, {"count": 0, "first": current_ts})
        s["count"] += 1
for line in open("/app/app.log").read().splitlines():
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ", line)
    if m:
        close()
        current_ts = m.group(1) if m.group(2) == "ERROR" else None
        last_exc = None
        continue
    e = re.match(r"([A-Za-z_][\w.]*): ", line)
    if e:
        last_exc = e.group(1)
close()
json.dump(stats, open("/app/exceptions.json", "w"), indent=2, sort_keys=True)
EOF
python3 /app/tb.py && cat /app/exceptions.json
