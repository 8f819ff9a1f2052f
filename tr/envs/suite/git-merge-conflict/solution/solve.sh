#!/usr/bin/env bash

cd /app/repo && git merge feature; git diff

cat > greet.py <<'EOF'
def greet(name, punctuation="!", shout=False):
    text = "Hello, " + name + punctuation
    return text.upper() if shout else text
EOF

git add greet.py && git commit -q --no-edit && git log --oneline --graph && git status --short
