#!/usr/bin/env bash

python3 - <<'EOF'
import json, sqlite3
orders = json.load(open("/app/orders.json"))
db = sqlite3.connect("/app/shop.db")
db.executescript("""
CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, country TEXT);
CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), placed_at TEXT);
CREATE TABLE order_items(order_id INTEGER REFERENCES orders(id), sku TEXT, qty INTEGER, price REAL);
""")
for o in orders:
    c = o["customer"]
    db.execute("INSERT OR IGNORE INTO customers VALUES (?, ?, ?)", (c["id"], c["name"], c["country"]))
    db.execute("INSERT INTO orders VALUES (?, ?, ?)", (o["id"], c["id"], o["placed_at"]))
    db.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?)", [(o["id"], i["sku"], i["qty"], i["price"]) for i in o["items"]])
db.commit()
EOF
python3 -c 'import sqlite3; db = sqlite3.connect("/app/shop.db"); print([db.execute("SELECT COUNT(*) FROM " + t).fetchone()[0] for t in ("customers", "orders", "order_items")])'
