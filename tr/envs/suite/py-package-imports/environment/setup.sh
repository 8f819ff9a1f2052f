#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p textkit
cat > textkit/__init__.py <<'EOF'
from stats import word_count
from normalize import clean

__all__ = ["clean", "word_count"]
EOF
cat > textkit/normalize.py <<'EOF'
import re


def clean(text):
    return re.sub(r"\s+", " ", text).strip().lower()
EOF
cat > textkit/stats.py <<'EOF'
from textkit import clean


def word_count(text):
    cleaned = clean(text)
    return len(cleaned.split(" ")) if cleaned else 0
EOF
