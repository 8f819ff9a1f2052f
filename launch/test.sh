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
# (an argument naming an existing file or folder, `::test` allowed, is a test path; `-k expr` is not)
for arg in "$@"; do [[ "$arg" != -* && -e "${arg%%::*}" ]] && { targets=(); break; }; done
# pytest-xdist, one worker per core (up to 4): the suite waits on sandboxes, Docker and
# subprocesses as much as it computes, so two workers on 2 cores fill what one leaves idle;
# `worksteal` evens out the few minutes-long end-to-end tests. `-n 0` in the arguments runs serially.
workers="${TR_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" --dist worksteal \
  "${targets[@]}" "$@"
