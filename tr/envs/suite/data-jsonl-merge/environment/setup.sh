#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import json
    crm = [
        {"id": 1, "name": "Ada", "email": "ada@old.example", "updated_at": "2024-01-03T10:00:00Z"},
        {"id": 2, "name": "Brian", "email": "brian@example.com", "updated_at": "2024-02-01T09:00:00Z"},
        {"id": 3, "name": "Chloe", "email": "chloe@example.com", "updated_at": "2024-03-09T12:00:00Z"},
        {"id": 1, "name": "Ada L.", "email": "ada@new.example", "updated_at": "2024-05-20T08:30:00Z"},
        "BROKEN",
        {"id": 4, "name": "Dmitri", "email": "dm@example.com", "updated_at": "2024-04-11T00:00:00Z"},
        {"id": 2, "name": "Brian K.", "email": "brian@stale.example", "updated_at": "2023-12-31T23:59:59Z"},
    ]
    billing = [
        {"customer_id": 1, "plan": "pro", "mrr": 49, "email": "billing@ada.example", "updated_at": "2024-04-01T00:00:00Z"},
        {"customer_id": 2, "plan": "basic", "mrr": 9, "email": "accounts@brian.example", "updated_at": "2024-06-01T00:00:00Z"},
        {"customer_id": 5, "plan": "team", "mrr": 199, "email": "ops@eve.example", "updated_at": "2024-01-01T00:00:00Z"},
        "{not json",
        {"customer_id": 3, "plan": "pro", "mrr": 49, "email": "chloe@example.com", "updated_at": "2024-01-01T00:00:00Z"},
        {"customer_id": 2, "plan": "pro", "mrr": 49, "email": "brian@billing.example", "updated_at": "2024-07-15T00:00:00Z"},
    ]
    def dump(rows):
        return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    return {"/app/crm.jsonl": dump(crm), "/app/billing.jsonl": dump(billing)}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
