import csv
import datetime
import gzip
import re
from pathlib import Path


def make():
    import random, gzip, datetime as dt
    rng = random.Random(99)
    t = dt.datetime(2024, 6, 1, 6, 40, 0, tzinfo=dt.timezone.utc)
    events = []
    msgs = ["request served", "cache miss for key user:%d", "db pool size %d", "payment gateway timeout after %dms",
            "disk usage %d%%", "scheduled job %d started", "login ok uid=%d", "upstream returned 502 (try %d)"]
    for i in range(130):
        t += dt.timedelta(seconds=rng.choice([0, 20, 45, 90, 240, 400]) if i % 17 else 0)
        level = "ERROR" if rng.random() < 0.22 else rng.choice(["INFO", "INFO", "WARN", "DEBUG"])
        m = rng.choice(msgs)
        events.append((t, "web01 app[%d]: %s %s" % (300 + i % 7, level, m % (i * 7) if "%d" in m else m)))
    zones = {".3.gz": 2, ".2.gz": 2, ".1": 0, "": -4}
    parts = {".3.gz": events[0:36], ".2.gz": events[33:70], ".1": events[67:100], "": events[100:]}
    def fmt(ev, hours):
        tz = dt.timezone(dt.timedelta(hours=hours))
        return ev[0].astimezone(tz).isoformat() + " " + ev[1]
    files = {}
    prev_lines = None
    for suffix, evs in parts.items():
        lines = [fmt(e, zones[suffix]) for e in evs]
        if prev_lines is not None:
            n = len(set(map(id, evs)) & set(map(id, prev_evs)))
            lines[:n] = prev_lines[-n:]
        if suffix == ".2.gz":
            lines[10], lines[11] = lines[11], lines[10]
        prev_lines, prev_evs = lines, evs
        text = "\n".join(lines) + "\n"
        files["/app/logs/app.log" + suffix] = gzip.compress(text.encode(), mtime=0) if suffix.endswith(".gz") else text
    return files


ORDER = ["/app/logs/app.log.3.gz", "/app/logs/app.log.2.gz", "/app/logs/app.log.1", "/app/logs/app.log"]
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def raw_lines():
    files = make()
    for path in ORDER:
        data = files[path]
        text = gzip.decompress(data).decode() if isinstance(data, bytes) else data
        yield from text.splitlines()


def expected():
    out = []
    for line in raw_lines():
        ts, rest = line.split(" ", 1)
        when = datetime.datetime.fromisoformat(ts).astimezone(datetime.timezone.utc)
        new = when.strftime("%Y-%m-%dT%H:%M:%SZ") + " " + rest
        if new not in out:
            out.append(new)
    return sorted(out, key=lambda l: l[:20])


def merged():
    return Path("/app/merged.log").read_text().splitlines()


def test_every_event_present():
    rests = {l.split(" ", 1)[1] for l in merged() if " " in l}
    assert rests >= {l.split(" ", 1)[1] for l in expected()}


def test_timestamps_rewritten_in_utc():
    got = merged()
    assert got and all(STAMP.fullmatch(l[:20]) for l in got)
    assert set(got) <= set(expected())


def test_duplicates_removed():
    got = merged()
    assert len(got) == len(set(got)) == len(expected())


def test_chronological_order():
    got = merged()
    assert got and all(STAMP.fullmatch(l[:20]) for l in got)
    assert [l[:20] for l in got] == sorted(l[:20] for l in got)


def test_errors_per_hour():
    with open("/app/errors_per_hour.csv", newline="") as f:
        rows = list(csv.reader(f))
    counts = {}
    for line in expected():
        if line.split(": ", 1)[1].startswith("ERROR "):
            counts[line[:13]] = counts.get(line[:13], 0) + 1
    assert rows == [["hour", "errors"]] + [[h, str(n)] for h, n in sorted(counts.items())]


def test_penalty_logs_unchanged():
    files = make()
    for path in ORDER:
        data = files[path]
        have = Path(path).read_bytes()
        assert (gzip.decompress(have) == gzip.decompress(data)) if isinstance(data, bytes) else have == data.encode()


def test_final_gate():
    assert merged() == expected()
    test_errors_per_hour()
