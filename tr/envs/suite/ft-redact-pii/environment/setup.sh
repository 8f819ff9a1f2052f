#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'
import os
files = {'docs/readme.md': '# Service notes\nContact ops@example.com or admin.team@corp.example.org for access.\nThe primary host is 10.0.0.15 and the backup is 192.168.1.200.\nVersion 2.4.1 is deployed.\n', 'docs/incidents/2024-03.txt': '03-02 outage on 172.16.5.4, reported by jane.doe+alerts@example.net\n03-09 no incident\n03-15 DNS 8.8.8.8 unreachable from 10.0.0.15; mail sent to noc@example.com and ops@example.com\n', 'docs/incidents/2024-04.txt': '04-01 all quiet\n04-20 patch 1.2.3 rolled out\n', 'docs/team/contacts.md': '| name | mail |\n|---|---|\n| Ann | ann_smith@example.co.uk |\n| Bo | bo-92@mail.example.com |\n', 'docs/legal/notice.txt': 'Send complaints to legal@example.com. Registered office server 203.0.113.9.\n'}
for path, text in files.items():
    os.makedirs(os.path.dirname('/app/' + path), exist_ok=True)
    open('/app/' + path, 'w').write(text)
EOF
