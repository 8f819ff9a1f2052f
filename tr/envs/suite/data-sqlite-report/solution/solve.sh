#!/usr/bin/env bash

sqlite3 /app/sales.db '.schema'

sqlite3 -header -csv /app/sales.db "SELECT p.category AS category, SUM(s.qty) AS units, printf('%.2f', SUM(s.qty * s.unit_price)) AS revenue FROM sales s JOIN products p ON p.id = s.product_id WHERE s.sold_on BETWEEN '2024-01-01' AND '2024-12-31' GROUP BY p.category ORDER BY SUM(s.qty * s.unit_price) DESC" > /app/report.csv && cat /app/report.csv
