#!/usr/bin/env bash

ls -la /app/logs; zcat /app/logs/app.log.2.gz | head -n 3; head -n 3 /app/logs/app.log

cat > /app/merge.py <<'EOF'
import gzip, datetime as dt, collections
seen, merged = set(), []
for name in ["app.log.3.gz", "app.log.2.gz", "app.log.1", "app.log"]:
    path = "/app/logs/" + name
    text = gzip.open(path, "rt").read() if name.endswith(".gz") else open(path).read()
    for line in text.splitlines():
        ts, rest = line.split(" ", 1)
        utc = dt.datetime.fromisoformat(ts).astimezone(dt.timezone.utc)
        out = utc.strftime("%Y-%m-%dT%H:%M:%SZ") + " " + rest
        if out not in seen:
            seen.add(out)
            merged.append((utc, out))
merged.sort(key=lambda x: x[0])
with open("/app/merged.log", "w") as f:
    f.writelines(out + "\n" for _, out in merged)
errors = collections.Counter(out[:13] for _, out in merged if out.split(": ", 1)[1].startswith("ERROR "))
with open("/app/errors_per_hour.csv", "w") as f:
    f.write("hour,errors\n")
    f.writelines("%s,%d\n" % (h, errors[h]) for h in sorted(errors))
EOF
python3 /app/merge.py && wc -l /app/merged.log && cat /app/errors_per_hour.csv
