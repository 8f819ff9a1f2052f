#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random
    rng = random.Random(21)
    events = []
    def fail(t, ip, user, invalid=False):
        events.append((t, "Failed password for %s%s from %s port %d ssh2" % ("invalid user " if invalid else "", user, ip, rng.randint(30000, 60000))))
    t0 = 10 * 3600
    for k in range(6):
        fail(t0 + k * 50, "203.0.113.5", rng.choice(["root", "admin", "test"]), invalid=k % 2 == 1)
    for k in range(7):
        fail(t0 + 1800 + k * 600, "198.51.100.20", "root")
    for k in range(4):
        fail(t0 + 4000 + k * 100, "192.0.2.44", "oracle", invalid=True)
    events.append((t0 + 4350, "message repeated 3 times: [ Failed password for invalid user oracle from 192.0.2.44 port 40022 ssh2]"))
    for k in range(4):
        fail(t0 + 7000 + k * 140, "198.51.100.7", "ubuntu", invalid=True)
    fail(t0 + 7601, "198.51.100.7", "ubuntu", invalid=True)
    for k in range(5):
        fail(t0 + 9000 + k * 10, "203.0.113.99", "pi", invalid=True)
    events.append((t0 + 9060, "message repeated 2 times: [ Failed password for invalid user pi from 203.0.113.99 port 41000 ssh2]"))
    for k in range(12):
        events.append((t0 + 300 * k + 7, "Accepted password for alice from 10.0.0.%d port 5%04d ssh2" % (k + 2, k)))
    events.append((t0 + 500, "Failed password for alice from 10.0.0.3 port 50001 ssh2"))
    events.append((t0 + 520, "Invalid user guest from 203.0.113.5 port 40100"))
    events.sort()
    lines = []
    for t, msg in events:
        lines.append("Mar  3 %02d:%02d:%02d web01 sshd[%d]: %s" % (t // 3600, t % 3600 // 60, t % 60, 1000 + t % 977, msg))
    return {"/app/auth.log": "\n".join(lines) + "\n"}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
