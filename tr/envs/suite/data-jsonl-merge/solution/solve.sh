#!/usr/bin/env bash

cat > /app/merge.py <<'EOF'
import json
def load(path, key):
    current, bad = {}, 0
    for line in open(path):
        try:
            rec = json.loads(line)
            assert isinstance(rec, dict)
        except (ValueError, AssertionError):
            bad += 1
            continue
        k = rec[key]
        if k not in current or rec["updated_at"] > current[k]["updated_at"]:
            current[k] = rec
    return current, bad
crm, b1 = load("/app/crm.jsonl", "id")
bill, b2 = load("/app/billing.jsonl", "customer_id")
out = {}
for cid in sorted(set(crm) | set(bill)):
    c, b = crm.get(cid), bill.get(cid)
    newer = max([r for r in (c, b) if r], key=lambda r: r["updated_at"])
    out[str(cid)] = {"name": c["name"] if c else None, "email": newer["email"],
                     "plan": b["plan"] if b else None, "mrr": b["mrr"] if b else 0}
json.dump(out, open("/app/customers.json", "w"), indent=2)
open("/app/skipped.txt", "w").write("%d\n" % (b1 + b2))
EOF
python3 /app/merge.py && cat /app/customers.json /app/skipped.txt
