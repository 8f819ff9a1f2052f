#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    rows = [(1, "Ada Lovelace", "ada@example.org", 36, "yes"), (2, "Grace Hopper", "grace@navy.example", 85, "no"),
            (3, "Turing, Alan", "alan@example.co.uk", 41, "yes"), (4, "Hamilton, Margaret H.", "mh@nasa.example", 37, "yes"),
            (5, 'Dennis "dmr" Ritchie', "dmr@bell.example", 70, "no"), (6, "Barbara Liskov", "liskov@mit.example", 84, "yes"),
            (7, "Ken Thompson", "ken@bell.example", 81, "no")]
    import csv, io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["id", "name", "email", "age", "active"])
    w.writerows(rows)
    return {"/app/people.csv": buf.getvalue()}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
