#!/usr/bin/env bash

python3 -c 'import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(db.execute("PRAGMA user_version").fetchone()[0]); [print(r) for q in sys.argv[2:] for r in db.execute(q)]' /app/app.db 'SELECT sql FROM sqlite_master' 'SELECT * FROM users LIMIT 3'

cat > /app/migrate.py <<'EOF'
import re
import sqlite3
import sys
def e164(raw):
    if raw is None:
        return None
    digits = re.sub(r"\D", "", raw)
    if len(digits) == 10:
        return "+1" + digits
    if len(digits) == 11 and digits.startswith("1"):
        return "+" + digits
    return "+" + digits
def migrate(path):
    db = sqlite3.connect(path, isolation_level=None)
    if db.execute("PRAGMA user_version").fetchone()[0] >= 2:
        return
    db.execute("BEGIN")
    try:
        db.execute("CREATE TABLE cities(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)")
        db.execute("INSERT INTO cities(name) SELECT DISTINCT city FROM users WHERE city IS NOT NULL ORDER BY city")
        db.execute("CREATE TABLE users_v2(id INTEGER PRIMARY KEY, first_name TEXT NOT NULL, last_name TEXT NOT NULL, phone TEXT, city_id INTEGER REFERENCES cities(id))")
        rows = db.execute("SELECT u.id, u.full_name, u.phone, c.id FROM users u LEFT JOIN cities c ON c.name = u.city").fetchall()
        for uid, full, phone, city_id in rows:
            words = full.split()
            db.execute("INSERT INTO users_v2 VALUES (?, ?, ?, ?, ?)", (uid, words[0], " ".join(words[1:]), e164(phone), city_id))
        db.execute("DROP TABLE users")
        db.execute("ALTER TABLE users_v2 RENAME TO users")
        db.execute("PRAGMA user_version = 2")
        db.execute("COMMIT")
    except Exception:
        db.execute("ROLLBACK")
        raise
    finally:
        db.close()
if __name__ == "__main__":
    migrate(sys.argv[1])
EOF

cp /app/app.db /tmp/copy.db && python3 /app/migrate.py /tmp/copy.db && python3 /app/migrate.py /tmp/copy.db && python3 -c 'import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(db.execute("PRAGMA user_version").fetchone()[0]); [print(r) for q in sys.argv[2:] for r in db.execute(q)]' /tmp/copy.db 'SELECT * FROM users' 'SELECT * FROM cities'

python3 /app/migrate.py /app/app.db && python3 -c 'import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(db.execute("PRAGMA user_version").fetchone()[0]); [print(r) for q in sys.argv[2:] for r in db.execute(q)]' /app/app.db 'SELECT count(*) FROM users'
