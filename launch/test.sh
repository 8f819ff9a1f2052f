#!/usr/bin/env bash
# The README's test command: set up (if needed), then run the whole test suite, including the
# tests against real bubblewrap and the real Docker engine. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/launch/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
