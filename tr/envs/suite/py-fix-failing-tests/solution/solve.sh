#!/usr/bin/env bash

cd /app/inventory && python3 -m unittest discover -s tests -t . 2>&1 | tail -n 30

cat > /app/inventory/inventory.py <<'EOF'
from decimal import Decimal
class OutOfStock(Exception):
    pass
class Inventory:
    def __init__(self, items=None):
        self.items = dict(items) if items else {}
    def add(self, sku, qty, price):
        if qty <= 0:
            raise ValueError("qty must be positive")
        have = self.items.get(sku, (0, price))[0]
        self.items[sku] = (have + qty, Decimal(price))
    def quantity(self, sku):
        return self.items.get(sku, (0, 0))[0]
    def remove(self, sku, qty):
        have, price = self.items.get(sku, (0, 0))
        if qty > have:
            raise OutOfStock(sku)
        self.items[sku] = (have - qty, price)
    def total_value(self):
        return sum((q * p for q, p in self.items.values()), Decimal("0"))
    def page(self, n, size=10):
        skus = sorted(self.items)
        return skus[(n - 1) * size:n * size]
EOF

cd /app/inventory && python3 -m unittest discover -s tests -t .
