#!/usr/bin/env bash

python3 -m venv --without-pip /app/.venv && ls /app/.venv/lib/python3*/site-packages

echo /app/src > "$(/app/.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/greetlib.pth"

printf '#!/app/.venv/bin/python\nimport sys\nfrom greetlib.cli import main\nsys.exit(main())\n' > /app/.venv/bin/greet && chmod +x /app/.venv/bin/greet && cd /tmp && /app/.venv/bin/greet Bob
