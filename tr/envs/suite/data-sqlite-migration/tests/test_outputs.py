import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest


V1_USERS = [(1, "Ada Lovelace", "(555) 123-4567", "London"), (2, "Grace Brewster Hopper", "555.987.6543", "New York"),
            (3, "Linus", "+1 555 222 3333", "Helsinki"), (4, "Alan Turing", "5554441111", "London"),
            (5, "Barbara Liskov", "1-555-000-1212", "Boston"), (6, "Ken Thompson", "555 321 7654", "New York")]


def make_v1(path, users):
    import sqlite3
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE users(id INTEGER PRIMARY KEY, full_name TEXT NOT NULL, phone TEXT, city TEXT);"
                     "CREATE TABLE notes(id INTEGER PRIMARY KEY, user_id INTEGER, body TEXT);")
    db.executemany("INSERT INTO users VALUES (?, ?, ?, ?)", users)
    db.executemany("INSERT INTO notes(user_id, body) VALUES (?, ?)", [(u[0], "note for %d" % u[0]) for u in users])
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


FRESH_USERS = [(10, "Edsger Wybe Dijkstra", "(555) 010-2020", "Austin"), (11, "Tony Hoare", "555-303-4040", "Oxford"),
               (12, "Niklaus Wirth", "+1 (555) 505-6060", "Zurich"), (13, "Frances", "15557778888", "Austin"),
               (14, "John  McCarthy", "555 909 1010", None)]


def expected(users):
    cities = sorted({c for *_, c in users if c is not None})
    out = []
    for uid, full, phone, city in users:
        words = full.split()
        digits = re.sub(r"\D", "", phone)
        e164 = "+1" + digits if len(digits) == 10 else "+" + digits
        out.append((uid, words[0], " ".join(words[1:]), e164, city))
    return out, cities


def read_v2(path):
    con = sqlite3.connect(path)
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        users = con.execute("SELECT u.id, u.first_name, u.last_name, u.phone, c.name FROM users u "
                            "LEFT JOIN cities c ON c.id = u.city_id ORDER BY u.id").fetchall()
        cities = sorted(r[0] for r in con.execute("SELECT name FROM cities"))
        notes = con.execute("SELECT * FROM notes ORDER BY id").fetchall()
        cols = [r[1] for r in con.execute("PRAGMA table_info(users)")]
        return version, users, cities, notes, cols
    finally:
        con.close()


@pytest.fixture
def fresh(tmp_path):
    path = str(tmp_path / "fresh.db")
    make_v1(path, FRESH_USERS)
    return path


def migrate(path):
    return subprocess.run(["python3", "/app/migrate.py", path], capture_output=True, text=True, timeout=20)


def dump(path):
    con = sqlite3.connect(path)
    try:
        return list(con.iterdump()), con.execute("PRAGMA user_version").fetchone()[0]
    finally:
        con.close()


def test_app_db_migrated():
    version, users, cities, notes, cols = read_v2("/app/app.db")
    assert version == 2 and "full_name" not in cols and "city" not in cols
    assert [u[0] for u in users] == [u[0] for u in V1_USERS]
    assert len(notes) == len(V1_USERS)


def test_names_split_on_fresh_db(fresh):
    assert migrate(fresh).returncode == 0
    want, _ = expected(FRESH_USERS)
    con = sqlite3.connect(fresh)
    users = con.execute("SELECT id, first_name, last_name FROM users ORDER BY id").fetchall()
    con.close()
    assert users == [w[:3] for w in want]


def test_phones_e164_on_fresh_db(fresh):
    assert migrate(fresh).returncode == 0
    want, _ = expected(FRESH_USERS)
    con = sqlite3.connect(fresh)
    phones = [r[0] for r in con.execute("SELECT phone FROM users ORDER BY id")]
    con.close()
    assert phones == [w[3] for w in want]


def test_cities_table_on_fresh_db(fresh):
    assert migrate(fresh).returncode == 0
    want, cities = expected(FRESH_USERS)
    _, users, got_cities, _, cols = read_v2(fresh)
    assert got_cities == cities and "city" not in cols
    assert [u[4] for u in users] == [w[4] for w in want]


def test_second_run_changes_nothing(fresh):
    assert migrate(fresh).returncode == 0
    once = dump(fresh)
    assert once[1] == 2
    r = migrate(fresh)
    assert r.returncode == 0, r.stderr
    assert dump(fresh) == once


def test_final_gate(fresh):
    assert migrate(fresh).returncode == 0
    want, cities = expected(FRESH_USERS)
    version, users, got_cities, notes, cols = read_v2(fresh)
    assert version == 2 and users == want and got_cities == cities
    assert cols == ["id", "first_name", "last_name", "phone", "city_id"]
    assert [n[1:] for n in notes] == [(u[0], "note for %d" % u[0]) for u in FRESH_USERS]
    want_app, cities_app = expected(V1_USERS)
    version, users, got_cities, notes, cols = read_v2("/app/app.db")
    assert version == 2 and users == want_app and got_cities == cities_app
    assert cols == ["id", "first_name", "last_name", "phone", "city_id"]
