import csv
import io
import json
from pathlib import Path


def make():
    rows = [(1, "Ada Lovelace", "ada@example.org", 36, "yes"), (2, "Grace Hopper", "grace@navy.example", 85, "no"),
            (3, "Turing, Alan", "alan@example.co.uk", 41, "yes"), (4, "Hamilton, Margaret H.", "mh@nasa.example", 37, "yes"),
            (5, 'Dennis "dmr" Ritchie', "dmr@bell.example", 70, "no"), (6, "Barbara Liskov", "liskov@mit.example", 84, "yes"),
            (7, "Ken Thompson", "ken@bell.example", 81, "no")]
    import csv, io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["id", "name", "email", "age", "active"])
    w.writerows(rows)
    return {"/app/people.csv": buf.getvalue()}



def source():
    return list(csv.DictReader(io.StringIO(make()["/app/people.csv"])))


def got():
    data = json.loads(Path("/app/people.json").read_text())
    assert isinstance(data, list) and all(isinstance(o, dict) for o in data)
    return data


def test_one_object_per_row_in_order():
    assert [str(o.get("id")) for o in got()] == [r["id"] for r in source()]


def test_text_fields_exact():
    data = got()
    assert len(data) == len(source())
    for o, r in zip(data, source()):
        assert (o.get("name"), o.get("email")) == (r["name"], r["email"])


def test_numbers_are_integers():
    data = got()
    assert data
    for o, r in zip(data, source()):
        assert type(o.get("id")) is int and type(o.get("age")) is int and o["age"] == int(r["age"])


def test_active_is_boolean():
    data = got()
    assert data
    for o, r in zip(data, source()):
        assert o.get("active") is (r["active"] == "yes")


def test_final_gate():
    want = [{"id": int(r["id"]), "name": r["name"], "email": r["email"], "age": int(r["age"]),
             "active": r["active"] == "yes"} for r in source()]
    assert got() == want
