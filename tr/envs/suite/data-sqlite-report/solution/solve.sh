#!/usr/bin/env bash

python3 -c 'import sqlite3; print(sqlite3.connect("/app/sales.db").execute("SELECT group_concat(sql, char(10)) FROM sqlite_master").fetchone()[0])'

python3 - <<'EOF'
import csv, sqlite3
db = sqlite3.connect("file:/app/sales.db?mode=ro", uri=True)
rows = db.execute("SELECT p.category, SUM(s.qty), SUM(s.qty * s.unit_price) AS revenue FROM sales s JOIN products p ON p.id = s.product_id WHERE s.sold_on BETWEEN '2024-01-01' AND '2024-12-31' GROUP BY p.category ORDER BY revenue DESC").fetchall()
with open("/app/report.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["category", "units", "revenue"])
    w.writerows([c, u, "%.2f" % r] for c, u, r in rows)
EOF
cat /app/report.csv
