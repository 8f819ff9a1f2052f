import re
from collections import Counter
from pathlib import Path


def make():
    import random
    rng = random.Random(5)
    counts = {"10.1.1.7": 41, "10.1.1.12": 33, "172.16.0.9": 26, "10.1.1.2": 26, "192.168.0.77": 19,
              "192.168.0.8": 19, "10.1.1.30": 19, "172.16.0.100": 12, "8.8.4.4": 3}
    reqs = [ip for ip, n in counts.items() for _ in range(n)]
    rng.shuffle(reqs)
    lines = ['%s - - [05/Mar/2024:10:%02d:%02d +0000] "GET /page/%d HTTP/1.1" 200 %d "-" "agent"' % (
        ip, (i // 60) % 60, i % 60, rng.randint(1, 50), rng.randint(100, 900)) for i, ip in enumerate(reqs)]
    return {"/app/access.log": "\n".join(lines) + "\n"}



def expected():
    counts = Counter(l.split()[0] for l in make()["/app/access.log"].splitlines())
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))[:5]


def lines():
    return Path("/app/top_ips.txt").read_text().splitlines()


def test_format():
    got = lines()
    assert len(got) == 5
    assert all(re.fullmatch(r"\d+ \d+\.\d+\.\d+\.\d+", l) for l in got), got


def test_busiest_address_first():
    first = lines()[0].split()
    assert (first[1], int(first[0])) == expected()[0]


def test_same_five_addresses():
    assert {l.split()[1] for l in lines()} == {ip for ip, _ in expected()}


def test_final_gate():
    assert lines() == ["%d %s" % (n, ip) for ip, n in expected()]
