"""The Base policy for the gym (issue 11): SFT of the embedded model on scripted-teacher demos.

  bash launch/run.sh experiments/base_policy.py                 # default, ~5 min on 2 cores
  python experiments/main.py --config=experiments/base_policy.py:quick --workdir=/tmp/base

Demos of the gym's `train` split (clean, mistake-then-repair, truncated), a fixed SFT budget, the
checkpoint whose `val` Pass@1 is closest to `select.target` kept as stage `base` (kind sft, actor
only) of WORKDIR's stage store; WORKDIR/base.json holds val/test Pass@1 (test by family and tier)
and wall_s; WORKDIR/base-test.txt the test table.  Model, tokenizer and system prompt: the
embedded default (tr/models/embedded.py), recorded in the stage manifest.  The settings are
`tr.stages.base.defaults(variant)`, shared with the pipeline's stage kind `base`.

Variants: `default`, `fast` (about half the cost), `quick` (end to end in well under a minute: a smoke test, not a Base), `smoke`.
"""

from tr.stages import base
from tr.train import pod

VARIANTS = base.VARIANTS
QUICK = base.QUICK
# The pod form's local smoke run (tests/test_launchers.py): smaller still than `quick` (one eval of
# two tasks, one turn), since that run has a 600 s limit on a loaded machine.
SMOKE = base.SMOKE
SMOKE_FLAGS = tuple(f"--config.{k}={v}" for k, v in SMOKE.items())


def get_config(variant: str = "default"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/base_policy.py: unknown variant {variant!r}; choose one of "
                         f"{VARIANTS}")
    config = base.defaults(variant)
    config.pod = pod.pod_config()
    config.job = "base"
    return config
