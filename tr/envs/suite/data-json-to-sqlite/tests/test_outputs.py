import json
import sqlite3
from pathlib import Path

import pytest


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


ORD = json.loads(make()["/app/orders.json"])


@pytest.fixture
def db():
    assert Path("/app/shop.db").is_file()
    con = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
    yield con
    con.close()


def test_customers_deduplicated(db):
    want = sorted({(o["customer"]["id"], o["customer"]["name"], o["customer"]["country"]) for o in ORD})
    assert sorted(db.execute("SELECT id, name, country FROM customers")) == want


def test_orders_reference_customers(db):
    want = sorted((o["id"], o["customer"]["id"], o["placed_at"]) for o in ORD)
    assert sorted(db.execute("SELECT id, customer_id, placed_at FROM orders")) == want


def test_order_items(db):
    want = sorted((o["id"], i["sku"], i["qty"], i["price"]) for o in ORD for i in o["items"])
    assert sorted(db.execute("SELECT order_id, sku, qty, price FROM order_items")) == want


def test_final_gate(db):
    revenue = {}
    for o in ORD:
        c = o["customer"]["name"]
        revenue[c] = revenue.get(c, 0) + sum(i["qty"] * i["price"] for i in o["items"])
    rows = db.execute("SELECT c.name, SUM(i.qty * i.price) FROM order_items i JOIN orders o ON o.id = i.order_id "
                      "JOIN customers c ON c.id = o.customer_id GROUP BY c.name").fetchall()
    assert {n: round(v, 6) for n, v in rows} == {n: round(v, 6) for n, v in revenue.items()}
    for table, n in [("customers", len({o["customer"]["id"] for o in ORD})), ("orders", len(ORD)),
                     ("order_items", sum(len(o["items"]) for o in ORD))]:
        assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == n
