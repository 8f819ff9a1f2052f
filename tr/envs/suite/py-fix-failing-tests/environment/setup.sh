#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p inventory/tests
cat > inventory/inventory.py <<'EOF'
class OutOfStock(Exception):
    pass


class Inventory:
    def __init__(self, items={}):
        self.items = items

    def add(self, sku, qty, price):
        if qty <= 0:
            raise ValueError("qty must be positive")
        have = self.items.get(sku, (0, price))[0]
        self.items[sku] = (have + qty, float(price))

    def quantity(self, sku):
        return self.items.get(sku, (0, 0))[0]

    def remove(self, sku, qty):
        have, price = self.items.get(sku, (0, 0))
        if qty > have:
            raise KeyError(sku)
        self.items[sku] = (have - qty, price)

    def total_value(self):
        return round(sum(q * p for q, p in self.items.values()), 2)

    def page(self, n, size=10):
        skus = sorted(self.items)
        return skus[n * size:(n + 1) * size]
EOF
touch inventory/tests/__init__.py
cat > inventory/tests/test_inventory.py <<'PYEOF'
import unittest
from decimal import Decimal

from inventory import Inventory, OutOfStock


class InventoryTest(unittest.TestCase):
    def test_add_and_remove(self):
        inv = Inventory()
        inv.add("apple", 5, "0.10")
        inv.remove("apple", 2)
        self.assertEqual(inv.quantity("apple"), 3)

    def test_instances_do_not_share_items(self):
        a = Inventory()
        a.add("pear", 1, "1.00")
        self.assertEqual(Inventory().quantity("pear"), 0)

    def test_out_of_stock(self):
        inv = Inventory()
        inv.add("fig", 1, "2.00")
        with self.assertRaises(OutOfStock):
            inv.remove("fig", 2)

    def test_total_value_is_exact(self):
        inv = Inventory()
        inv.add("a", 3, "0.10")
        inv.add("b", 1, "0.20")
        self.assertEqual(inv.total_value(), Decimal("0.50"))

    def test_pages_are_one_based(self):
        inv = Inventory()
        for i in range(25):
            inv.add("sku%02d" % i, 1, "1.00")
        self.assertEqual(inv.page(1, size=10)[0], "sku00")
        self.assertEqual(inv.page(3, size=10), ["sku20", "sku21", "sku22", "sku23", "sku24"])


if __name__ == "__main__":
    unittest.main()
PYEOF
