#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random
    rng = random.Random(3)
    base = {"GET /api/items": 120, "GET /api/search": 480, "POST /api/orders": 900, "GET /": 30,
            "GET /api/report": 2600, "POST /login": 260, "GET /static/app.js": 5}
    lines = []
    for i in range(300):
        ep = rng.choice(sorted(base))
        method, path = ep.split()
        if path.startswith("/api") and rng.random() < 0.5:
            path += "?q=%d&page=%d" % (rng.randint(1, 99), rng.randint(1, 5))
        ms = max(1, int(rng.gauss(base[ep], base[ep] * 0.2)))
        lines.append('10.0.%d.%d - - [06/Mar/2024:09:%02d:%02d +0000] "%s %s HTTP/1.1" 200 512 %.3f' % (
            rng.randint(0, 3), rng.randint(1, 200), i // 60, i % 60, method, path, ms / 1000))
    return {"/app/timing.log": "\n".join(lines) + "\n"}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
