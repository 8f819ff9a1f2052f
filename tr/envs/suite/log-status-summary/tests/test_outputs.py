import json
import re
from pathlib import Path


def make():
    import random
    rng = random.Random(11)
    ips = ["10.0.0.%d" % i for i in range(1, 9)] + ["192.168.7.%d" % i for i in range(10, 14)]
    paths = ["/", "/login", "/api/items", "/api/items/500", "/static/app.js", "/api/orders?page=2", "/health"]
    agents = ["curl/8.0", "Mozilla/5.0 (X11; Linux x86_64)", "bot-404-scanner/1.0", "python-requests/2.31"]
    statuses = [200] * 12 + [201, 204, 301, 304, 400, 401, 403, 404, 404, 500, 502, 503]
    lines = []
    for i in range(240):
        ts = "%02d/Mar/2024:%02d:%02d:%02d +0000" % (4 + i // 120, (i // 10) % 24, (i * 7) % 60, (i * 13) % 60)
        st = rng.choice(statuses)
        lines.append('%s - - [%s] "%s %s HTTP/1.1" %d %d "-" "%s"' % (
            rng.choice(ips), ts, rng.choice(["GET", "GET", "POST"]), rng.choice(paths), st, rng.randint(0, 5000), rng.choice(agents)))
    return {"/app/access.log": "\n".join(lines) + "\n"}


LINE = re.compile(r'^\S+ \S+ \S+ \[[^]]+\] "[^"]*" (\d{3}) ')


def statuses():
    return [int(LINE.match(l).group(1)) for l in make()["/app/access.log"].splitlines()]


def summary():
    data = json.loads(Path("/app/summary.json").read_text())
    assert isinstance(data, dict)
    return data


def test_total():
    assert summary().get("total") == len(statuses())


def test_client_errors():
    assert summary().get("client_errors") == sum(400 <= s < 500 for s in statuses())


def test_server_errors():
    assert summary().get("server_errors") == sum(500 <= s < 600 for s in statuses())


def test_penalty_log_untouched():
    assert Path("/app/access.log").read_text() == make()["/app/access.log"]


def test_final_gate():
    s = statuses()
    assert summary() == {"total": len(s), "client_errors": sum(400 <= x < 500 for x in s),
                         "server_errors": sum(500 <= x < 600 for x in s)}
