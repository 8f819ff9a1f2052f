import csv
import re
from collections import defaultdict
from pathlib import Path


def make():
    import random
    rng = random.Random(3)
    base = {"GET /api/items": 120, "GET /api/search": 480, "POST /api/orders": 900, "GET /": 30,
            "GET /api/report": 2600, "POST /login": 260, "GET /static/app.js": 5}
    lines = []
    for i in range(300):
        ep = rng.choice(sorted(base))
        method, path = ep.split()
        if path.startswith("/api") and rng.random() < 0.5:
            path += "?q=%d&page=%d" % (rng.randint(1, 99), rng.randint(1, 5))
        ms = max(1, int(rng.gauss(base[ep], base[ep] * 0.2)))
        lines.append('10.0.%d.%d - - [06/Mar/2024:09:%02d:%02d +0000] "%s %s HTTP/1.1" 200 512 %.3f' % (
            rng.randint(0, 3), rng.randint(1, 200), i // 60, i % 60, method, path, ms / 1000))
    return {"/app/timing.log": "\n".join(lines) + "\n"}



def truth():
    n, s = defaultdict(int), defaultdict(float)
    for line in make()["/app/timing.log"].splitlines():
        m = re.search(r'"(\S+) ([^ ?"]+)(?:\?[^ "]*)? HTTP', line)
        key = m.group(1) + " " + m.group(2)
        n[key] += 1
        s[key] += float(line.split()[-1]) * 1000
    return {k: (n[k], s[k] / n[k]) for k in n}


def rows():
    with open("/app/slow.csv", newline="") as f:
        data = list(csv.reader(f))
    assert data and data[0] == ["endpoint", "count", "avg_ms"], data[:1]
    return data[1:]


def test_rows_parse():
    got = rows()
    assert got
    for endpoint, count, avg in got:
        assert re.fullmatch(r"[A-Z]+ /\S*", endpoint) and "?" not in endpoint
        int(count), float(avg)


def test_counts_correct():
    got, t = rows(), truth()
    assert got
    for endpoint, count, _ in got:
        assert int(count) == t[endpoint][0], endpoint


def test_averages_correct():
    got, t = rows(), truth()
    assert got
    for endpoint, _, avg in got:
        assert abs(float(avg) - t[endpoint][1]) <= 0.051, endpoint


def test_only_slow_endpoints_listed():
    assert {r[0] for r in rows()} == {k for k, (_, a) in truth().items() if a > 250}


def test_final_gate():
    want = sorted(((k, n, a) for k, (n, a) in truth().items() if a > 250), key=lambda x: -x[2])
    got = rows()
    assert [r[0] for r in got] == [k for k, _, _ in want]
    for (endpoint, count, avg), (_, n, a) in zip(got, want):
        assert int(count) == n and abs(float(avg) - a) <= 0.051 and re.fullmatch(r"\d+\.\d", avg)
