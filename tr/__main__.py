"""`python -m tr`: the `termrl` command (tr/cli.py)."""

import sys

from tr.cli import main

if __name__ == "__main__":
    sys.exit(main())
