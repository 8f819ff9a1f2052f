import json
from pathlib import Path


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



def expected():
    lines = make()["/app/app.log"].split("\n")
    stats = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if " ERROR " in line[:30] and i + 1 < len(lines) and lines[i + 1].startswith("Traceback"):
            ts = line[:23]
            j = i + 1
            while j + 1 < len(lines) and not lines[j + 1][:4].isdigit() and lines[j + 1] != "":
                j += 1
            # skip chained parts: keep walking while the block continues after blank lines
            while j + 2 < len(lines) and lines[j + 1] == "" and lines[j + 2].startswith("During handling"):
                j += 3
                while j + 1 < len(lines) and not lines[j + 1][:4].isdigit() and lines[j + 1] != "":
                    j += 1
            kind = lines[j].split(": ", 1)[0]
            entry = stats.setdefault(kind, {"count": 0, "first": ts})
            entry["count"] += 1
            i = j
        i += 1
    return stats


def got():
    data = json.loads(Path("/app/exceptions.json").read_text())
    assert isinstance(data, dict) and data
    return data


def test_exception_types():
    assert set(got()) == set(expected())


def test_counts():
    have = got()
    for kind, e in expected().items():
        assert have.get(kind, {}).get("count") == e["count"], kind


def test_first_timestamps():
    have = got()
    for kind, e in expected().items():
        assert have.get(kind, {}).get("first") == e["first"], kind


def test_final_gate():
    assert got() == expected()
    assert "OSError" not in got()
