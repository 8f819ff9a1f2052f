#!/usr/bin/env bash

cd /tmp && PYTHONPATH=/app python3 -c 'import textkit'; echo "import exit status $?"

printf 'from .normalize import clean\nfrom .stats import word_count\n\n__all__ = ["clean", "word_count"]\n' > /app/textkit/__init__.py && sed -i 's/^from textkit import clean$/from .normalize import clean/' /app/textkit/stats.py

cat > /app/textkit/__main__.py <<'EOF'
import sys
from .stats import word_count
for path in sys.argv[1:]:
    with open(path) as f:
        print(word_count(f.read()), path)
EOF

cd /tmp && printf 'one two\nthree\n' > /tmp/a.txt && PYTHONPATH=/app python3 -m textkit /tmp/a.txt
