import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would


def run(cmd, cwd="/tmp", env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=20, **kw)

TESTS = 'import unittest\nfrom decimal import Decimal\n\nfrom inventory import Inventory, OutOfStock\n\n\nclass InventoryTest(unittest.TestCase):\n    def test_add_and_remove(self):\n        inv = Inventory()\n        inv.add("apple", 5, "0.10")\n        inv.remove("apple", 2)\n        self.assertEqual(inv.quantity("apple"), 3)\n\n    def test_instances_do_not_share_items(self):\n        a = Inventory()\n        a.add("pear", 1, "1.00")\n        self.assertEqual(Inventory().quantity("pear"), 0)\n\n    def test_out_of_stock(self):\n        inv = Inventory()\n        inv.add("fig", 1, "2.00")\n        with self.assertRaises(OutOfStock):\n            inv.remove("fig", 2)\n\n    def test_total_value_is_exact(self):\n        inv = Inventory()\n        inv.add("a", 3, "0.10")\n        inv.add("b", 1, "0.20")\n        self.assertEqual(inv.total_value(), Decimal("0.50"))\n\n    def test_pages_are_one_based(self):\n        inv = Inventory()\n        for i in range(25):\n            inv.add("sku%02d" % i, 1, "1.00")\n        self.assertEqual(inv.page(1, size=10)[0], "sku00")\n        self.assertEqual(inv.page(3, size=10), ["sku20", "sku21", "sku22", "sku23", "sku24"])\n\n\nif __name__ == "__main__":\n    unittest.main()\n'
CWD = "/app/inventory"


def py(code):
    r = run(["python3", "-c", "from inventory import *\nfrom decimal import Decimal\n" + code], cwd=CWD)
    return r.stdout.strip() + r.stderr.strip()[-300:]


def test_fresh_instances_independent():
    assert py("a = Inventory(); a.add('x', 2, '1.5'); b = Inventory(); print(b.quantity('x'), a.quantity('x'))") == "0 2"


def test_out_of_stock_raised_and_nothing_changes():
    out = py("i = Inventory(); i.add('k', 3, '1.00')\n"
             "try:\n    i.remove('k', 4)\nexcept OutOfStock:\n    print('raised', i.quantity('k'))")
    assert out == "raised 3"


def test_total_value_exact_decimal():
    out = py("i = Inventory(); i.add('a', 10, '0.10'); i.add('b', 3, '0.35'); i.add('a', 1, '0.10')\n"
             "v = i.total_value(); print(type(v).__name__, v == Decimal('2.15'))")
    assert out == "Decimal True"


def test_one_based_pages():
    out = py("i = Inventory()\nfor s in 'edcba': i.add(s, 1, '1')\nprint(i.page(1, 2), i.page(3, 2), i.page(4, 2))")
    assert out == "['a', 'b'] ['e'] []"


def test_penalty_tests_untouched():
    assert Path("/app/inventory/tests/test_inventory.py").read_text() == TESTS


def test_final_gate():
    r = run(["python3", "-m", "unittest", "discover", "-s", "tests", "-t", "."], cwd=CWD)
    assert r.returncode == 0 and "OK" in r.stderr, r.stderr[-2000:]
    assert "Ran 5 tests" in r.stderr
    test_fresh_instances_independent()
    test_out_of_stock_raised_and_nothing_changes()
    test_total_value_exact_decimal()
    test_one_based_pages()
