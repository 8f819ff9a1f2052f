#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import json, random
    rng = random.Random(4)
    customers = [(101, "Acme Ltd", "GB"), (102, "Globex", "US"), (103, "Initech", "US"), (104, "Umbrella, Inc.", "DE"), (105, "Hooli", "US")]
    orders = []
    for oid in range(5001, 5019):
        c = rng.choice(customers)
        items = [{"sku": "SKU-%03d" % rng.randint(1, 40), "qty": rng.randint(1, 5), "price": round(rng.uniform(1, 90), 2)}
                 for _ in range(rng.randint(1, 4))]
        orders.append({"id": oid, "placed_at": "2024-04-%02dT%02d:15:00Z" % (oid % 28 + 1, oid % 24),
                       "customer": {"id": c[0], "name": c[1], "country": c[2]}, "items": items})
    return {"/app/orders.json": json.dumps(orders, indent=2) + "\n"}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
