#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p src/greetlib
cat > src/greetlib/__init__.py <<'EOF'
__version__ = "0.3.0"
EOF
cat > src/greetlib/cli.py <<'EOF'
import sys


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    shout = "--shout" in args
    names = [a for a in args if a != "--shout"] or ["world"]
    for name in names:
        text = "Hello, %s!" % name
        print(text.upper() if shout else text)
    return 0
EOF
