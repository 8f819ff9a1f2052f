#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    rows = [
        "Date,Customer,Amount",
        "2024-03-05,  Acme Ltd ,$1,234.50",
        "05/03/2024,Globex,1234.5",
        "",
        "\"March 7, 2024\",\"Initech, Inc.\",(12.00)",
        "2024-03-05,Acme Ltd,\"$1,234.50\"",
        "11/03/2024,Hooli  ,99",
        "   ",
        "\"April 1, 2024\",Globex,\"$2,000\"",
        "2024-04-01,Globex,2000.00",
        "31/12/2023,\"Umbrella, Corp\",$0.5",
        "\"January 15, 2024\",Initech,(1,050.25)",
    ]
    text = "\ufeff" + "\r\n".join(rows) + "\r\n"
    return {"/app/raw.csv": text.encode("utf-8")}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
