#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: system packages, a virtualenv in .venv, the pinned
# requirements. Sourced by run.sh and test.sh; safe to run again (it only installs what changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TR_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

# Debian packages: bubblewrap for the local sandbox; the userland the built-in tasks use inside
# it (and that the Docker base image is assembled from); python3 for Debian's interpreter in images.
DEBIAN_PACKAGES=(bubblewrap git make gcc libc6-dev binutils patch procps util-linux python3
                 python3.11 python3-venv jq sqlite3 gettext-base file less bzip2 xz-utils
                 ca-certificates)
# Bazel only when asked (TR_BAZEL=1): Debian's bazel-bootstrap (4.2), which runs BUILD offline; its
# autoconfigured C++ toolchain (which py_test/py_binary require) uses gcc from the list above.
[ "${TR_BAZEL:-0}" = "1" ] && DEBIAN_PACKAGES+=(bazel-bootstrap)
need_apt=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "[setup] installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
stamp="$VENV/.requirements.sha256"
reqs=("$ROOT/requirements.txt" "$ROOT/requirements-test.txt")
# TPU hosts (TR_TPU=1, set by launch/tpu_pod.sh) also get jax[tpu] and vllm-tpu.
[ "${TR_TPU:-0}" = "1" ] && reqs+=("$ROOT/requirements-tpu.txt")
want="$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing requirements"
  "$VENV/bin/pip" install -q $(printf -- '-r %s ' "${reqs[@]}")
  echo "$want" > "$stamp"
fi
# Ahead-of-time compilation for TPU topologies (TR_AOT=1, set by launch/test.sh): libtpu (~700 MB),
# kept apart from the stamp above so the README's main command never downloads it.
if [ "${TR_AOT:-0}" = "1" ]; then
  aot_stamp="$VENV/.requirements-aot.sha256"
  aot_want="$(sha256sum "$ROOT/requirements-aot.txt" | cut -d' ' -f1)"
  if [ ! -f "$aot_stamp" ] || [ "$(cat "$aot_stamp")" != "$aot_want" ]; then
    echo "[setup] installing requirements-aot.txt (libtpu, for TPU ahead-of-time compilation)"
    "$VENV/bin/pip" install -q -r "$ROOT/requirements-aot.txt" && echo "$aot_want" > "$aot_stamp" \
      || echo "[setup] WARNING: could not install libtpu; tests/test_aot.py will skip its TPU compile" >&2
  fi
fi
