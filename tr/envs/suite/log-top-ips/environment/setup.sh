#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random
    rng = random.Random(5)
    counts = {"10.1.1.7": 41, "10.1.1.12": 33, "172.16.0.9": 26, "10.1.1.2": 26, "192.168.0.77": 19,
              "192.168.0.8": 19, "10.1.1.30": 19, "172.16.0.100": 12, "8.8.4.4": 3}
    reqs = [ip for ip, n in counts.items() for _ in range(n)]
    rng.shuffle(reqs)
    lines = ['%s - - [05/Mar/2024:10:%02d:%02d +0000] "GET /page/%d HTTP/1.1" 200 %d "-" "agent"' % (
        ip, (i // 60) % 60, i % 60, rng.randint(1, 50), rng.randint(100, 900)) for i, ip in enumerate(reqs)]
    return {"/app/access.log": "\n".join(lines) + "\n"}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
