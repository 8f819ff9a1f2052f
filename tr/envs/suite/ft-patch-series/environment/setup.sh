#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p src patches /tmp/gen
cd /tmp/gen
python3 - <<'EOF'
vs = ['import sys\n\n\ndef add(a, b):\n    return a + b\n\n\nOPS = {"add": add}\n\n\ndef main(argv):\n    op, a, b = argv[0], int(argv[1]), int(argv[2])\n    print(OPS[op](a, b))\n\n\nif __name__ == "__main__":\n    main(sys.argv[1:])\n', 'import sys\n\n\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\nOPS = {"add": add, "mul": mul}\n\n\ndef main(argv):\n    op, a, b = argv[0], int(argv[1]), int(argv[2])\n    print(OPS[op](a, b))\n\n\nif __name__ == "__main__":\n    main(sys.argv[1:])\n', 'import sys\n\n\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef power(a, b):\n    return a ** b\n\n\nOPS = {"add": add, "mul": mul, "pow": power}\n\n\ndef main(argv):\n    op, a, b = argv[0], int(argv[1]), int(argv[2])\n    print(OPS[op](a, b))\n\n\nif __name__ == "__main__":\n    main(sys.argv[1:])\n', 'import sys\n\n\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef power(a, b):\n    return a ** b\n\n\ndef sub(a, b):\n    return a - b\n\n\nOPS = {"add": add, "mul": mul, "pow": power, "sub": sub}\n\n\ndef main(argv):\n    if len(argv) != 3 or argv[0] not in OPS:\n        print("usage: calc.py {%s} A B" % ",".join(sorted(OPS)), file=sys.stderr)\n        sys.exit(2)\n    op, a, b = argv[0], int(argv[1]), int(argv[2])\n    print(OPS[op](a, b))\n\n\nif __name__ == "__main__":\n    main(sys.argv[1:])\n']
for i, v in enumerate(vs):
    open(f"/tmp/gen/v{i}.py", "w").write(v)
EOF
diff -u --label a/calc.py --label b/calc.py v0.py v1.py > /app/patches/0001-add-mul.patch || true
diff -u --label calc.py --label calc.py v1.py v2.py > /app/patches/0002-add-pow.patch || true
diff -u --label a/src/calc.py --label b/src/calc.py v2.py v3.py > /app/patches/0003-sub-and-usage.patch || true
sed 's/$/\r/' v0.py > /app/src/calc.py
cd /app && rm -rf /tmp/gen
