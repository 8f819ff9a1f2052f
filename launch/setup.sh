#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: system packages, a virtualenv in .venv, the pinned
# requirements. Sourced by run.sh and test.sh; safe to run again (it only installs what changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TR_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v git >/dev/null 2>&1 || need_apt+=(git)
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
