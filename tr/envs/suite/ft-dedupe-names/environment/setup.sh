#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'
names = ['Alice', ' bob', 'CAROL ', 'alice', 'Dave', '', 'bob', '  Eve  ', 'carol', 'Mallory', 'dave ', '', 'Trent', 'eve', 'Zoe', 'oscar', 'Oscar', ' Peggy', 'ALICE', 'victor']
open('/app/names.txt', 'w').write('\n'.join(names) + '\n')
EOF
