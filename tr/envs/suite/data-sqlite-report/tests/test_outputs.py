import csv
import sqlite3

import pytest


def truth():
    con = sqlite3.connect("file:/app/sales.db?mode=ro", uri=True)
    cat = dict(con.execute("SELECT id, category FROM products"))
    units, revenue = {}, {}
    for pid, qty, price, day in con.execute("SELECT product_id, qty, unit_price, sold_on FROM sales"):
        if day.startswith("2024-"):
            c = cat[pid]
            units[c] = units.get(c, 0) + qty
            revenue[c] = revenue.get(c, 0.0) + qty * price
    con.close()
    assert len(units) == 5
    return units, revenue


def rows():
    with open("/app/report.csv", newline="") as f:
        data = list(csv.reader(f))
    assert data[0] == ["category", "units", "revenue"]
    return data[1:]


def test_categories():
    units, _ = truth()
    assert sorted(r[0] for r in rows()) == sorted(units)


def test_units():
    units, _ = truth()
    got = rows()
    assert len(got) == len(units)
    for r in got:
        assert int(r[1]) == units.get(r[0]), r


def test_revenue():
    _, revenue = truth()
    got = rows()
    assert len(got) == len(revenue)
    for r in got:
        assert r[0] in revenue and abs(float(r[2]) - revenue[r[0]]) < 0.006, r


def test_penalty_database_unchanged():
    con = sqlite3.connect("file:/app/sales.db?mode=ro", uri=True)
    assert con.execute("SELECT COUNT(*), SUM(qty) FROM sales").fetchone()[0] == 400
    assert con.execute("SELECT COUNT(*) FROM products").fetchone()[0] == 20


def test_final_gate():
    units, revenue = truth()
    want = [[c, str(units[c]), "%.2f" % revenue[c]] for c in sorted(revenue, key=lambda c: -revenue[c])]
    assert rows() == want
