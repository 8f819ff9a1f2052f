#!/usr/bin/env bash

cat > /app/render.sh <<'EOF'
#!/usr/bin/env python3
import os
import re
import sys
PATTERN = re.compile(r"\$\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
def main():
    if len(sys.argv) != 2:
        print("usage: render.sh TEMPLATE", file=sys.stderr)
        return 2
    with open(sys.argv[1], newline="") as f:
        text = f.read()
    missing = []
    for m in PATTERN.finditer(text):
        name = m.group(2)
        if name and name not in os.environ and name not in missing:
            missing.append(name)
    if missing:
        for name in missing:
            print("render.sh: missing variable: %s" % name, file=sys.stderr)
        return 1
    def sub(m):
        return "${%s}" % m.group(1) if m.group(1) else os.environ[m.group(2)]
    sys.stdout.write(PATTERN.sub(sub, text))
    return 0
sys.exit(main())
EOF
chmod +x /app/render.sh && HOST=box USER_NAME='a&b' /app/render.sh /app/templates/motd.tpl; /app/render.sh /app/templates/motd.tpl; echo "status $?"
