#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random, gzip, datetime as dt
    rng = random.Random(99)
    t = dt.datetime(2024, 6, 1, 6, 40, 0, tzinfo=dt.timezone.utc)
    events = []
    msgs = ["request served", "cache miss for key user:%d", "db pool size %d", "payment gateway timeout after %dms",
            "disk usage %d%%", "scheduled job %d started", "login ok uid=%d", "upstream returned 502 (try %d)"]
    for i in range(130):
        t += dt.timedelta(seconds=rng.choice([0, 20, 45, 90, 240, 400]) if i % 17 else 0)
        level = "ERROR" if rng.random() < 0.22 else rng.choice(["INFO", "INFO", "WARN", "DEBUG"])
        m = rng.choice(msgs)
        events.append((t, "web01 app[%d]: %s %s" % (300 + i % 7, level, m % (i * 7) if "%d" in m else m)))
    zones = {".3.gz": 2, ".2.gz": 2, ".1": 0, "": -4}
    parts = {".3.gz": events[0:36], ".2.gz": events[33:70], ".1": events[67:100], "": events[100:]}
    def fmt(ev, hours):
        tz = dt.timezone(dt.timedelta(hours=hours))
        return ev[0].astimezone(tz).isoformat() + " " + ev[1]
    files = {}
    prev_lines = None
    for suffix, evs in parts.items():
        lines = [fmt(e, zones[suffix]) for e in evs]
        if prev_lines is not None:
            n = len(set(map(id, evs)) & set(map(id, prev_evs)))
            lines[:n] = prev_lines[-n:]
        if suffix == ".2.gz":
            lines[10], lines[11] = lines[11], lines[10]
        prev_lines, prev_evs = lines, evs
        text = "\n".join(lines) + "\n"
        files["/app/logs/app.log" + suffix] = gzip.compress(text.encode(), mtime=0) if suffix.endswith(".gz") else text
    return files

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
