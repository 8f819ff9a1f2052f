#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random, sqlite3, os, tempfile
    rng = random.Random(12)
    path = "/app/sales.db"
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE products(id INTEGER PRIMARY KEY, name TEXT, category TEXT);"
                     "CREATE TABLE sales(id INTEGER PRIMARY KEY, product_id INTEGER, qty INTEGER, unit_price REAL, sold_on TEXT);")
    cats = ["Tools", "Garden, Outdoor", "Kitchen", "Toys \"Kids\"", "Books"]
    for pid in range(1, 21):
        db.execute("INSERT INTO products VALUES (?, ?, ?)", (pid, "Product %d" % pid, cats[pid % 5]))
    for sid in range(1, 401):
        year = rng.choice([2023, 2024, 2024, 2025])
        db.execute("INSERT INTO sales VALUES (?, ?, ?, ?, ?)", (sid, rng.randint(1, 20), rng.randint(1, 9),
                   round(rng.uniform(2, 60), 2), "%d-%02d-%02d" % (year, rng.randint(1, 12), rng.randint(1, 28))))
    db.commit()
    db.close()
    return {}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
