"""The Base policy for the gym (issue 11): SFT of the embedded model on scripted-teacher demos.

  bash launch/run.sh experiments/base_policy.py                 # default, ~5 min on 2 cores
  python experiments/main.py --config=experiments/base_policy.py:quick --workdir=/tmp/base

Demos of the gym's `train` split (clean, mistake-then-repair, truncated), a fixed SFT budget, the
checkpoint whose `val` Pass@1 is closest to `select.target` kept as stage `base` (kind sft, actor
only) of WORKDIR's stage store; WORKDIR/base.json holds val/test Pass@1 (test by family and tier)
and wall_s; WORKDIR/base-test.txt the test table.  Model, tokenizer and system prompt: the
embedded default (tr/stages/embedded.py), recorded in the stage manifest.

Variants: `default`, `quick` (end to end in well under a minute: a smoke test, not a Base).
"""

import ml_collections

from tr.train import pod

VARIANTS = ("default", "quick")

QUICK = {"demos.tasks": 24, "sft.steps": 6, "sft.eval_start": 3, "sft.eval_every": 3, "sft.batch": 4,
         "eval.val_count": 8, "eval.test_count": 8, "eval.max_turns": 2,
         "eval.max_output_tokens": 32}
# The pod form's local smoke run (tests/test_launchers.py): smaller still than `quick` (one eval of
# two tasks, one turn), since that run has a 600 s limit on a loaded machine.
SMOKE = {**QUICK, "demos.tasks": 8, "sft.steps": 2, "sft.eval_start": 2, "sft.eval_every": 2,
         "sft.batch": 2, "eval.val_count": 2, "eval.test_count": 2, "eval.max_turns": 1,
         "eval.max_output_tokens": 16}
SMOKE_FLAGS = tuple(f"--config.{k}={v}" for k, v in SMOKE.items())


def get_config(variant: str = "default"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/base_policy.py: unknown variant {variant!r}; choose one of "
                         f"{VARIANTS}")
    config = ml_collections.ConfigDict()
    config.pod = pod.pod_config()
    config.job = "base"
    config.seed = 0
    config.stage = "base"
    config.model = "gym"                                  # tr/stages/embedded.py
    config.tokenizer = "tr/stages/gym_tokenizer.json"     # or "byte"
    config.concurrency = 16                               # sandboxes at once = sampler batch
    config.demos = ml_collections.ConfigDict()
    config.demos.tasks = 448                              # train instances, one demo each
    config.demos.p_mistake = 0.3                          # mistake first, then repair
    config.demos.p_truncate = 0.2                         # reference cut short, then DONE
    config.sft = ml_collections.ConfigDict()
    config.sft.steps = 240
    config.sft.batch = 8                                  # packed rows per update (~3 demos a row)
    config.sft.length = 512                               # row length (tokens); longer demos dropped
    config.sft.learning_rate = 3e-3
    config.sft.warmup = 20
    config.sft.eval_start = 80                            # val evaluations at 80, 120, ..., 240
    config.sft.eval_every = 40
    config.eval = ml_collections.ConfigDict()
    config.eval.val_count = 32
    config.eval.test_count = 64
    config.eval.temperature = 0.6                         # the papers' evaluation sampling
    config.eval.top_p = 0.95
    config.eval.max_turns = 5                             # reference <= 3 commands + DONE
    config.eval.max_output_tokens = 64
    config.eval.prompt_bucket = 256                       # the sampler's smallest prompt bucket
    config.select = ml_collections.ConfigDict()
    config.select.target = 0.20
    config.select.band = (0.10, 0.35)
    if variant == "quick":
        for key, value in QUICK.items():
            section, field = key.split(".")
            config[section][field] = value
    return config
