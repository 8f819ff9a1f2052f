"""The `aot` job's own config: every step of `tr.train.aot`'s interface written out by hand.

  python experiments/main.py --config=experiments/pod_scale.py --workdir=/tmp/aot   # the `aot` job
  termrl aot --config=experiments/pod_scale.py --topology=v5e:2x2

The `aot` job (tr/train/aot.py) prints per-chip argument / output / temporary bytes of each step
against the chip's HBM, from the fields `model`, `pod` (mesh, axis rules, remat), `train`
(tr.train.updates.default_config()) and `shapes` (LAYOUT.md). Whether a recipe fits a pod is asked
of the recipe itself, whose stages give those fields (`tr.stages.pod_plan`):
`termrl aot --config=experiments/terminal_rsi.py:paper` (or `reterm.py:paper`); their paper
variants hold the pod layout that fits and the measured per-chip table.

Variants:
  small         the tiny model, every step, on this host's CPU devices (seconds; the tests' setting)
"""

import ml_collections

from tr.train import pod
from tr.train.updates import default_config as train_defaults

VARIANTS = ("small",)

# The pod form's local smoke run (tests/test_launchers.py): the small variant on this host's CPU.
SMOKE_FLAGS = ()


def _shape(rows, length, micro_batches):
    return {"rows": rows, "length": length, "micro_batches": micro_batches}


def get_config(variant: str = "small"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/pod_scale.py: unknown variant {variant!r}; choose one of {VARIANTS}")
    config = ml_collections.ConfigDict()
    config.job = "aot"
    config.aot = {"topology": "cpu"}
    config.model = "tiny"
    config.pod = pod.pod_config()
    config.train = train_defaults()
    config.train.logprob_chunk_size = 64
    config.train.grpo.group_size = 16
    config.shapes = {"sft": _shape(8, 128, 2), "critic": _shape(8, 128, 2), "ppo": _shape(8, 128, 2),
                     "grpo": _shape(32, 128, 2),
                     "sampler": {"rows": 8, "prompt_len": 64, "new_tokens": 32}}
    return config
