#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p report
cat > report/email.py <<'EOF'
def format_address(name, addr):
    return "%s <%s>" % (name, addr.lower())
EOF
cat > report/string.py <<'EOF'
def title(text):
    return " ".join(w[:1].upper() + w[1:].lower() for w in text.split())
EOF
cat > report/main.py <<'EOF'
import http.client
import json
import logging
import sys

from email import format_address
from string import title

log = logging.getLogger("report")


def main(path):
    with open(path) as f:
        rows = json.load(f)
    for row in rows:
        print("%s | %s | %s" % (title(row["name"]), format_address(row["name"], row["email"]),
                                http.client.responses[row["status"]]))
    log.debug("printed %d rows", len(rows))


if __name__ == "__main__":
    main(sys.argv[1])
EOF
cat > report/sample.json <<'EOF'
[{"name": "ada LOVELACE", "email": "Ada@Example.org", "status": 200},
 {"name": "grace hopper", "email": "GRACE@navy.example", "status": 404}]
EOF
python3 -c "import py_compile; py_compile.compile('report/string.py', cfile='report/string.pyc', doraise=True)"
