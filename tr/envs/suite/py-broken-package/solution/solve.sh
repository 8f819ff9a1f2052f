#!/usr/bin/env bash

cd /tmp && /app/notely/bin/notely list; cat /app/notely/bin/notely

cat > /app/notely/bin/notely <<'EOF'
#!/usr/bin/env python3
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "src"))
from notely.commands import main
sys.exit(main(sys.argv[1:]))
EOF

cd /app/notely/src/notely && sed -i 's/^import models$/from . import models/' storage.py && sed -i 's/^DEFAULT_DB = os.path.expanduser("~\/.notely.json")$/def default_db():\n    return os.environ.get("NOTELY_DB") or os.path.expanduser("~\/.notely.json")/; s/        self.path = path or DEFAULT_DB/        self.path = path or default_db()/' storage.py && cat storage.py

cd /app/notely/src/notely && sed -i 's/^from notely.storage import Store$//; s/    def save(self, store: Store):/    def save(self, store):/' models.py && sed -i 's|        with open("data/help.txt") as f:|        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "help.txt")) as f:|; s/^import sys$/import os\nimport sys/' commands.py

printf 'import sys\nfrom .commands import main\nsys.exit(main(sys.argv[1:]))\n' > /app/notely/src/notely/__main__.py

cd /tmp && export NOTELY_DB=/tmp/n.json && /app/notely/bin/notely add hello && PYTHONPATH=/app/notely/src python3 -m notely list && /app/notely/bin/notely help && rm -f /tmp/n.json && unset NOTELY_DB
