#!/usr/bin/env bash

python3 - <<'EOF'
import json, sqlite3
orders = json.load(open("/app/orders.json"))
db = sqlite3.connect("/app/shop.db")
db.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, country TEXT)")
db.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, placed_at TEXT)")
for o in orders:
    c = o["customer"]
    db.execute("INSERT OR IGNORE INTO customers VALUES (?, ?, ?)", (c["id"], c["name"], c["country"]))
    db.execute("INSERT INTO orders VALUES (?, ?, ?)", (o["id"], c["id"], o["placed_at"]))
db.commit()
EOF
