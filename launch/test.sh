#!/usr/bin/env bash
# The README's test command: set up (if needed), then run the whole test suite, including the
# tests against real bubblewrap and the real Docker engine. Extra arguments go to pytest; test
# paths among them replace the default (the whole tests/ folder).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TR_AOT=1 bash "$ROOT/launch/setup.sh"   # with libtpu: tests/test_aot.py compiles for a TPU topology
cd "$ROOT"
# With no test paths given (as CI runs it), the whole suite; else only the paths given.
targets=(tests)
for arg in "$@"; do [[ "$arg" == -* ]] || { targets=(); break; }; done
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "${targets[@]}" "$@"
