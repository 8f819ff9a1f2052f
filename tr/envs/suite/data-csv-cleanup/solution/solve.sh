#!/usr/bin/env bash

head -c 300 /app/raw.csv | od -c | head -n 12

cat > /app/clean.py <<'EOF'
import csv, datetime, io
text = open("/app/raw.csv", encoding="utf-8-sig", newline="").read()
rows = [r for r in csv.reader(io.StringIO(text)) if any(f.strip() for f in r)]
out, seen = [], set()
for r in rows[1:]:
    d, cust, amount = r[0].strip(), r[1].strip(), ",".join(r[2:]).strip()
    for fmt in ("%Y-%m-%d", "%d/%m/%Y", "%B %d, %Y"):
        try:
            d = datetime.datetime.strptime(d, fmt).strftime("%Y-%m-%d")
            break
        except ValueError:
            pass
    neg = amount.startswith("(")
    value = float(amount.strip("()").replace("$", "").replace(",", ""))
    row = (d, cust, "%.2f" % (-value if neg else value))
    if row not in seen:
        seen.add(row)
        out.append(row)
with open("/app/clean.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["date", "customer", "amount"])
    w.writerows(out)
EOF
python3 /app/clean.py && cat /app/clean.csv
