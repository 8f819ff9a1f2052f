#!/usr/bin/env bash
set -euo pipefail
cd /app
mkdir -p notely/bin notely/src/notely/data
cd notely
cat > bin/notely <<'EOF'
#!/usr/bin/env python3
import sys

sys.path.insert(0, "src")
from notely.cli import main

sys.exit(main(sys.argv[1:]))
EOF
chmod +x bin/notely
cat > src/notely/__init__.py <<'EOF'
from .storage import Store

__version__ = "1.2.0"
EOF
cat > src/notely/models.py <<'EOF'
from notely.storage import Store


class Note:
    def __init__(self, number, text):
        self.number = number
        self.text = text

    def to_dict(self):
        return {"number": self.number, "text": self.text}

    @classmethod
    def from_dict(cls, d):
        return cls(d["number"], d["text"])

    def save(self, store: Store):
        store.append(self)
EOF
cat > src/notely/storage.py <<'EOF'
import json
import os

import models

DEFAULT_DB = os.path.expanduser("~/.notely.json")


class Store:
    def __init__(self, path=None):
        self.path = path or DEFAULT_DB

    def load(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [models.Note.from_dict(d) for d in json.load(f)]

    def append(self, note):
        notes = self.load() + [note]
        with open(self.path, "w") as f:
            json.dump([n.to_dict() for n in notes], f)
EOF
cat > src/notely/commands.py <<'EOF'
import sys

from .models import Note
from .storage import Store


def main(argv):
    store = Store()
    if not argv or argv[0] == "help":
        with open("data/help.txt") as f:
            sys.stdout.write(f.read())
        return 0
    if argv[0] == "add":
        note = Note(len(store.load()) + 1, " ".join(argv[1:]))
        note.save(store)
        print("added #%d" % note.number)
        return 0
    if argv[0] == "list":
        for note in store.load():
            print("%d: %s" % (note.number, note.text))
        return 0
    print("unknown command: %s" % argv[0], file=sys.stderr)
    return 2
EOF
printf '%s' 'notely - tiny notes

  notely add TEXT   store a note
  notely list       show all notes
  notely help       this text
' > src/notely/data/help.txt
