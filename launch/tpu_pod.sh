#!/usr/bin/env bash
# Launch an experiment on every worker of a Cloud TPU VM slice (gcloud).
#   TPU_NAME=my-v5p-128 TPU_ZONE=us-east5-a GCP_PROJECT=my-proj \
#   bash launch/tpu_pod.sh [--dry-run] CONFIG[:variant] gs://BUCKET/runs/RUN [absl flags...]
# 1. checks the config (and the flags) locally: experiments/main.py --print_config;
# 2. packs this checkout (git archive HEAD) and copies it to every worker;
# 3. on every worker, detached: launch/setup.sh with TR_TPU=1 (jax[tpu], vllm-tpu), then
#    experiments/main.py --config.pod.distributed=True, so jax.distributed.initialize() joins the
#    hosts into one process group (the config's `pod` section: tr/train/pod.py); output goes to
#    ~/$TR_REMOTE_DIR/logs/RUN.log on each worker.
# --dry-run prints every command it would run, the run's config, its GCS workdir and how to follow
# the logs and resume, and runs nothing remote.
# Optional: TR_REMOTE_DIR (default tr), TR_PYTHON (the local interpreter used for step 1).
set -euo pipefail
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
missing=()
for var in TPU_NAME TPU_ZONE GCP_PROJECT; do [ -n "${!var:-}" ] || missing+=("$var"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tpu_pod.sh: set ${missing[*]} (see the comment at the top of this file)" >&2; exit 2
fi
if [ "$#" -lt 2 ]; then
  echo "usage: tpu_pod.sh [--dry-run] CONFIG[:variant] gs://BUCKET/runs/RUN [absl flags...]" >&2; exit 2
fi
CONFIG="$1"; WORKDIR="$2"; shift 2
case "$WORKDIR" in
  gs://*/*) ;;
  *) echo "tpu_pod.sh: the workdir must be a GCS path gs://BUCKET/..., which every worker reads and writes (got '$WORKDIR')" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TR_PYTHON:-$ROOT/.venv/bin/python}"; [ -x "$PY" ] || PY=python3
RUN="$(basename "$WORKDIR")"
REMOTE_DIR="${TR_REMOTE_DIR:-tr}"
TARBALL="${TMPDIR:-/tmp}/tr-src-$RUN.tar.gz"
GC=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$TPU_ZONE" --project="$GCP_PROJECT")

# The entry point every host runs (printf %q keeps each absl flag one word on the remote shell).
printf -v MAIN_CMD '%q ' .venv/bin/python experiments/main.py --config="$CONFIG" --workdir="$WORKDIR" \
  --config.pod.distributed=True "$@"
echo "config ($CONFIG, as every host resolves it):"
(cd "$ROOT" && "$PY" experiments/main.py --config="$CONFIG" --print_config --config.pod.distributed=True "$@") \
  || { echo "tpu_pod.sh: the config or a flag is wrong (above); nothing was launched" >&2; exit 2; }
echo "workdir: $WORKDIR"
echo "entry point on every host: $MAIN_CMD"

REMOTE="set -e; mkdir -p $REMOTE_DIR/logs && tar -xzf /tmp/tr-src-$RUN.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR \
&& TR_TPU=1 bash launch/setup.sh && (setsid nohup $MAIN_CMD > logs/$RUN.log 2>&1 < /dev/null &)"

run() {  # print a command as one shell-quoted line; run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ "$DRY_RUN" = 1 ] || "$@"
}
if [ "$DRY_RUN" = 0 ]; then
  command -v gcloud >/dev/null || { echo "tpu_pod.sh: gcloud is not installed" >&2; exit 2; }
fi
run git -C "$ROOT" archive --format=tar.gz -o "$TARBALL" HEAD
run "${GC[@]}" scp "$TARBALL" "$TPU_NAME:/tmp/tr-src-$RUN.tar.gz" --worker=all "${WHERE[@]}"
run "${GC[@]}" ssh "$TPU_NAME" --worker=all "${WHERE[@]}" --command="$REMOTE"

echo "follow the logs (worker 0; --worker=N for another host):"
printf '  '; printf '%q ' "${GC[@]}" ssh "$TPU_NAME" --worker=0 "${WHERE[@]}" --command="tail -F $REMOTE_DIR/logs/$RUN.log"; printf '\n'
echo "resume: run this same command again with the same workdir: finished stages are skipped and a"
echo "  killed stage resumes from its latest checkpoint in $WORKDIR"
[ "$DRY_RUN" = 1 ] && echo "(dry run: nothing was run)"
exit 0
