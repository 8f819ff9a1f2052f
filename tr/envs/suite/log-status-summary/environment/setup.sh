#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random
    rng = random.Random(11)
    ips = ["10.0.0.%d" % i for i in range(1, 9)] + ["192.168.7.%d" % i for i in range(10, 14)]
    paths = ["/", "/login", "/api/items", "/api/items/500", "/static/app.js", "/api/orders?page=2", "/health"]
    agents = ["curl/8.0", "Mozilla/5.0 (X11; Linux x86_64)", "bot-404-scanner/1.0", "python-requests/2.31"]
    statuses = [200] * 12 + [201, 204, 301, 304, 400, 401, 403, 404, 404, 500, 502, 503]
    lines = []
    for i in range(240):
        ts = "%02d/Mar/2024:%02d:%02d:%02d +0000" % (4 + i // 120, (i // 10) % 24, (i * 7) % 60, (i * 13) % 60)
        st = rng.choice(statuses)
        lines.append('%s - - [%s] "%s %s HTTP/1.1" %d %d "-" "%s"' % (
            rng.choice(ips), ts, rng.choice(["GET", "GET", "POST"]), rng.choice(paths), st, rng.randint(0, 5000), rng.choice(agents)))
    return {"/app/access.log": "\n".join(lines) + "\n"}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
