#!/usr/bin/env bash
# Launch an experiment on a GKE TPU cluster with one `xpk workload create` (the maxtext way).
#   XPK_CLUSTER=my-cluster TPU_TYPE=v5p-128 GCP_PROJECT=my-proj GCP_ZONE=us-east5-a \
#   bash launch/xpk.sh [--dry-run] CONFIG[:variant] gs://BUCKET/runs/RUN [absl flags...]
# 1. checks the config (and the flags) locally: experiments/main.py --print_config;
# 2. xpk builds an image from BASE_IMAGE with this checkout as its script dir and runs, on every
#    host of NUM_SLICES slices of TPU_TYPE: launch/setup.sh with TR_TPU=1, then experiments/main.py
#    with --config.pod.distributed=True (jax.distributed.initialize() joins the hosts).
# --dry-run prints every command it would run, the run's config, its GCS workdir and how to follow
# the logs and resume, and runs nothing.
# Optional: NUM_SLICES (1), BASE_IMAGE (python:3.11-slim), XPK_WORKLOAD (tr-RUN), TR_PYTHON.
set -euo pipefail
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
missing=()
for var in XPK_CLUSTER TPU_TYPE GCP_PROJECT GCP_ZONE; do [ -n "${!var:-}" ] || missing+=("$var"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "xpk.sh: set ${missing[*]} (see the comment at the top of this file)" >&2; exit 2
fi
if [ "$#" -lt 2 ]; then
  echo "usage: xpk.sh [--dry-run] CONFIG[:variant] gs://BUCKET/runs/RUN [absl flags...]" >&2; exit 2
fi
CONFIG="$1"; WORKDIR="$2"; shift 2
case "$WORKDIR" in
  gs://*/*) ;;
  *) echo "xpk.sh: the workdir must be a GCS path gs://BUCKET/..., which every host reads and writes (got '$WORKDIR')" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TR_PYTHON:-$ROOT/.venv/bin/python}"; [ -x "$PY" ] || PY=python3
RUN="$(basename "$WORKDIR")"
WORKLOAD="${XPK_WORKLOAD:-tr-$(echo "$RUN" | tr '[:upper:]_.' '[:lower:]--' | tr -cd 'a-z0-9-' | cut -c1-36)}"
WHERE=(--cluster="$XPK_CLUSTER" --project="$GCP_PROJECT" --zone="$GCP_ZONE")

printf -v MAIN_CMD '%q ' .venv/bin/python experiments/main.py --config="$CONFIG" --workdir="$WORKDIR" \
  --config.pod.distributed=True "$@"
echo "config ($CONFIG, as every host resolves it):"
(cd "$ROOT" && "$PY" experiments/main.py --config="$CONFIG" --print_config --config.pod.distributed=True "$@") \
  || { echo "xpk.sh: the config or a flag is wrong (above); nothing was launched" >&2; exit 2; }
echo "workdir: $WORKDIR"
echo "entry point on every host: $MAIN_CMD"

run() {  # print a command as one shell-quoted line; run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ "$DRY_RUN" = 1 ] || "$@"
}
if [ "$DRY_RUN" = 0 ]; then
  command -v xpk >/dev/null || { echo "xpk.sh: xpk is not installed (pip install xpk)" >&2; exit 2; }
fi
run xpk workload create "${WHERE[@]}" --workload="$WORKLOAD" --tpu-type="$TPU_TYPE" \
  --num-slices="${NUM_SLICES:-1}" --base-docker-image="${BASE_IMAGE:-python:3.11-slim}" \
  --script-dir="$ROOT" --command="TR_TPU=1 bash launch/setup.sh && $MAIN_CMD"

echo "follow the logs:"
printf '  '; printf '%q ' xpk workload list "${WHERE[@]}" --filter-by-job="$WORKLOAD"; printf '\n'
printf '  '; printf '%q ' gcloud container clusters get-credentials "$XPK_CLUSTER" --project="$GCP_PROJECT" --location="${GCP_ZONE%-*}"; printf '\n'
printf '  '; printf '%q ' kubectl logs -f --all-containers --prefix --max-log-requests=64 \
  -l "jobset.sigs.k8s.io/jobset-name=$WORKLOAD"; printf '\n'
echo "resume: delete the workload, then run this same command again with the same workdir: finished"
echo "  stages are skipped and a killed stage resumes from its latest checkpoint in $WORKDIR"
printf '  '; printf '%q ' xpk workload delete "${WHERE[@]}" --workload="$WORKLOAD"; printf '\n'
[ "$DRY_RUN" = 1 ] && echo "(dry run: nothing was run)"
exit 0
