#!/usr/bin/env bash
# Launch an experiment on every worker of a TPU pod slice, with one gcloud call.
#   TPU_NAME=my-v5p-64 TPU_ZONE=us-east5-a GCP_PROJECT=my-proj \
#   bash launch/tpu_pod.sh experiments/evaluate.py:tiny_model gs://bucket/runs/eval-1 [absl flags...]
# Each worker gets the same checkout (synced with `gcloud compute tpus tpu-vm scp`), runs
# launch/setup.sh with TR_TPU=1 (jax[tpu], vllm-tpu), then experiments/main.py with
# --config.distributed=True so jax.distributed.initialize() joins the hosts into one mesh.
set -euo pipefail
missing=()
for var in TPU_NAME TPU_ZONE GCP_PROJECT; do [ -n "${!var:-}" ] || missing+=("$var"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tpu_pod.sh: set ${missing[*]} (see the comment at the top of this file)" >&2; exit 2
fi
if [ "$#" -lt 2 ]; then
  echo "usage: tpu_pod.sh CONFIG[:variant] WORKDIR [absl flags...]" >&2; exit 2
fi
command -v gcloud >/dev/null || { echo "tpu_pod.sh: gcloud is not installed" >&2; exit 2; }
CONFIG="$1"; WORKDIR="$2"; shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REMOTE_DIR="${TR_REMOTE_DIR:-tr}"
GC=(gcloud compute tpus tpu-vm --zone="$TPU_ZONE" --project="$GCP_PROJECT")
git -C "$ROOT" archive --format=tar.gz -o /tmp/tr-src.tar.gz HEAD
"${GC[@]}" scp /tmp/tr-src.tar.gz "$TPU_NAME:/tmp/tr-src.tar.gz" --worker=all
printf -v extra '%q ' "$@"
"${GC[@]}" ssh "$TPU_NAME" --worker=all --command="set -e; mkdir -p $REMOTE_DIR && \
  tar -xzf /tmp/tr-src.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR && TR_TPU=1 bash launch/setup.sh && \
  .venv/bin/python experiments/main.py --config=$CONFIG --workdir=$WORKDIR --config.distributed=True $extra"
