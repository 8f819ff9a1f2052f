#!/usr/bin/env bash
set -euo pipefail
cd /app
python3 - <<'EOF'

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

make_v1('/app/app.db', V1_USERS)
EOF
