#!/usr/bin/env bash

cat > /app/notely/bin/notely <<'EOF'
#!/usr/bin/env python3
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "src"))
from notely.commands import main
sys.exit(main(sys.argv[1:]))
EOF

cd /app/notely/src/notely && sed -i 's/^import models$/from . import models/' storage.py && sed -i 's/^from notely.storage import Store$//; s/    def save(self, store: Store):/    def save(self, store):/' models.py
