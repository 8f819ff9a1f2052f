import csv
import datetime
import re
from pathlib import Path

EXPECTED = [
    ("2024-03-05", "Acme Ltd", "1234.50"),
    ("2024-03-05", "Globex", "1234.50"),
    ("2024-03-07", "Initech, Inc.", "-12.00"),
    ("2024-03-11", "Hooli", "99.00"),
    ("2024-04-01", "Globex", "2000.00"),
    ("2023-12-31", "Umbrella, Corp", "0.50"),
    ("2024-01-15", "Initech", "-1050.25"),
]


def rows():
    with open("/app/clean.csv", newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_encoding_header_and_blank_lines():
    data = Path("/app/clean.csv").read_bytes()
    assert not data.startswith(b"\xef\xbb\xbf") and b"\r" not in data
    lines = data.decode().split("\n")
    assert lines[0] == "date,customer,amount"
    assert all(l.strip() for l in lines[1:-1]) and lines[-1] == ""


def test_dates_iso():
    body = rows()[1:]
    assert body
    for r in body:
        datetime.date.fromisoformat(r[0])
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", r[0])
    assert sorted({r[0] for r in body}) == sorted({e[0] for e in EXPECTED})


def test_amounts_normalised():
    body = rows()[1:]
    assert body and all(len(r) == 3 for r in body)
    assert all(re.fullmatch(r"-?\d+\.\d\d", r[2]) for r in body)
    assert sorted({r[2] for r in body}) == sorted({e[2] for e in EXPECTED})


def test_customers_trimmed():
    body = rows()[1:]
    assert body and len(body[0]) >= 2
    assert sorted({r[1] for r in body}) == sorted({e[1] for e in EXPECTED})


def test_final_gate():
    assert rows() == [["date", "customer", "amount"]] + [list(e) for e in EXPECTED]
