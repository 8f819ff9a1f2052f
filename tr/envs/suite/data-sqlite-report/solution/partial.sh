#!/usr/bin/env bash

sqlite3 -header -csv /app/sales.db "SELECT p.category AS category, SUM(s.qty) AS units, printf('%.2f', SUM(s.qty * s.unit_price)) AS revenue FROM sales s JOIN products p ON p.id = s.product_id GROUP BY p.category ORDER BY 3 DESC" > /app/report.csv
