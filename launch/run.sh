#!/usr/bin/env bash
# The README's main command: set up (if needed), then run the main job, Terminal-RSI on the gym
# (CPU, the embedded model, the local bubblewrap sandbox); the evaluation job: experiments/evaluate.py.
#   bash launch/run.sh [CONFIG[:variant]] [more absl flags...]
# Outputs go to $TR_WORKDIR (default: workdir/<config name>).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/launch/setup.sh"
CONFIG="${1:-experiments/terminal_rsi.py}"
shift || true
name="$(basename "${CONFIG%%:*}" .py)"
[[ "$CONFIG" == *:* ]] && name="${name}_${CONFIG##*:}"
WORKDIR="${TR_WORKDIR:-$ROOT/workdir/$name}"
cd "$ROOT"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"  # the CPU main job (a venv with libtpu would probe for a TPU)
exec "$ROOT/.venv/bin/python" experiments/main.py --config="$CONFIG" --workdir="$WORKDIR" "$@"
