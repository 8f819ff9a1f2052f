#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import os
files = {'src/app/main.py': "import sys\r\nfrom app import util\r\n\r\ndef main():\r\n\tprint(util.greet(sys.argv[1] if len(sys.argv) > 1 else 'world'))   \r\n\r\nif __name__ == '__main__':\r\n\tmain()\r\n", 'src/app/util.py': "def greet(name):  \n\tif not name:\n\t\treturn 'hello'\t\n\treturn 'hello ' + name\n", 'src/app/__init__.py': '', 'src/tools/report.py': "ROWS = [\n\t('a', 1),  \n\t('b', 2),\n]\n\ndef total():\r\n\treturn sum(n for _, n in ROWS)\r\n", 'src/tools/clean.py': 'def clean(s):\n    return s.strip()\n', 'src/Makefile': 'run:\n\tpython3 -m app.main\n', 'src/notes.txt': 'keep\tthese\ttabs   \r\n'}
for path, text in files.items():
    os.makedirs(os.path.dirname('/app/' + path), exist_ok=True)
    open('/app/' + path, 'w', newline='').write(text)
EOF
