#!/usr/bin/env bash

cat > /app/merge.py <<'EOF'
import json
out = {}
for line in open("/app/crm.jsonl"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    k = str(r["id"])
    if k not in out or r["updated_at"] > out[k]["updated_at"]:
        out[k] = {"name": r["name"], "email": r["email"], "plan": None, "mrr": 0, "updated_at": r["updated_at"]}
json.dump(out, open("/app/customers.json", "w"), indent=2)
EOF
python3 /app/merge.py
