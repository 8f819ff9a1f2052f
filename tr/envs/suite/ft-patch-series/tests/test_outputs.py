import subprocess
from pathlib import Path

CALC = "/app/src/calc.py"
FINAL = 'import sys\n\n\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef power(a, b):\n    return a ** b\n\n\ndef sub(a, b):\n    return a - b\n\n\nOPS = {"add": add, "mul": mul, "pow": power, "sub": sub}\n\n\ndef main(argv):\n    if len(argv) != 3 or argv[0] not in OPS:\n        print("usage: calc.py {%s} A B" % ",".join(sorted(OPS)), file=sys.stderr)\n        sys.exit(2)\n    op, a, b = argv[0], int(argv[1]), int(argv[2])\n    print(OPS[op](a, b))\n\n\nif __name__ == "__main__":\n    main(sys.argv[1:])\n'


def calc(*args):
    return subprocess.run(["python3", CALC, *map(str, args)], capture_output=True, text=True, timeout=10)


def test_mul():
    assert calc("mul", 6, 7).stdout.strip() == "42"
    assert calc("mul", -3, 11).stdout.strip() == "-33"


def test_pow():
    assert calc("pow", 2, 10).stdout.strip() == "1024"
    assert calc("pow", 7, 0).stdout.strip() == "1"


def test_sub_and_usage():
    assert calc("sub", 5, 8).stdout.strip() == "-3"
    r = calc("div", 1, 2)
    assert r.returncode == 2
    assert "usage: calc.py {add,mul,pow,sub} A B" in r.stderr


def test_lf_endings_and_no_leftovers():
    data = Path(CALC).read_bytes()
    assert b"\\r" not in data
    assert b"def mul" in data
    assert not [p for p in Path("/app/src").rglob("*") if p.suffix in (".orig", ".rej")]


def test_final_gate():
    assert Path(CALC).read_text() == FINAL
    assert calc("add", 19, 23).stdout.strip() == "42"
    assert sorted(p.name for p in Path("/app/src").iterdir() if p.name != "__pycache__") == ["calc.py"]
