#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

def make():
    import random
    rng = random.Random(8)
    kinds = [("ValueError", "invalid literal for int() with base 10: 'x'"), ("KeyError", "'user_id'"),
             ("json.decoder.JSONDecodeError", "Expecting value: line 1 column 1 (char 0)"),
             ("TimeoutError", "timed out"), ("myapp.errors.QuotaExceeded", "quota of 100 exceeded")]
    out = []
    for i in range(60):
        ts = "2024-05-01 %02d:%02d:%02d,%03d" % (8 + i // 20, (i * 3) % 60, (i * 17) % 60, (i * 37) % 1000)
        r = rng.random()
        if r < 0.55:
            out.append("%s INFO worker: job %d done in %.2fs" % (ts, i, rng.random() * 3))
            if rng.random() < 0.2:
                out.append("%s WARNING worker: retry budget low (KeyError seen before)" % ts)
            continue
        kind, msg = rng.choice(kinds)
        out.append("%s ERROR worker: job %d failed" % (ts, i))
        out.append("Traceback (most recent call last):")
        out.append('  File "/srv/app/worker.py", line %d, in run' % rng.randint(10, 300))
        out.append("    result = handle(job)")
        if rng.random() < 0.35:
            out.append('  File "/srv/app/io.py", line 42, in fetch')
            out.append("    raise OSError('connection reset')")
            out.append("OSError: connection reset")
            out.append("")
            out.append("During handling of the above exception, another exception occurred:")
            out.append("")
            out.append("Traceback (most recent call last):")
            out.append('  File "/srv/app/worker.py", line 77, in run')
            out.append("    retry(job)")
        out.append('  File "/srv/app/handlers.py", line %d, in handle' % rng.randint(10, 300))
        out.append("    raise Something")
        out.append("%s: %s" % (kind, msg))
    return {"/app/app.log": "\n".join(out) + "\n"}

for _p, _t in make().items():
    import os
    os.makedirs(os.path.dirname(_p), exist_ok=True)
    open(_p, 'wb' if isinstance(_t, bytes) else 'w').write(_t)
EOF
