#!/usr/bin/env bash

cat > /app/migrate.py <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("ALTER TABLE users ADD COLUMN first_name TEXT")
db.execute("ALTER TABLE users ADD COLUMN last_name TEXT")
for uid, full in db.execute("SELECT id, full_name FROM users").fetchall():
    words = full.split()
    db.execute("UPDATE users SET first_name = ?, last_name = ? WHERE id = ?", (words[0], " ".join(words[1:]), uid))
db.execute("PRAGMA user_version = 2")
db.commit()
EOF
python3 /app/migrate.py /app/app.db
