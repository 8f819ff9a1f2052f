"""What a recipe's stages compile, as `tr.train.aot`'s interface (`model`, `pod`, `train`,
`shapes`), derived from the experiment config itself (`termrl aot --config=experiments/X.py:V`), so
"will it fit?" needs no second config to keep in step with the recipe.

* A config with `shapes` already is the interface (experiments/pod_scale.py): returned as it is.
* A pipeline recipe (`stages` + `stage_defaults`: Terminal-RSI): the stage defaults laid over
  `stage_config.stage_defaults()`; the model (`""`: the embedded `gym`) and `train`; each stage kind's
  updates (`KIND_UPDATES`) on `arrays.rows` x `arrays.length` rows, in micro-batches of
  `train.micro_batch_rows` rows (0: the pod's `train.num_micro_batches`); the sampler as
  `actor.episode_sampler` builds it: max(`MIN_SLOTS`, `rollout.concurrency`) rows caching the
  model's whole context (its `max_seq_len`, overrides applied), `rollout.max_output_tokens` new
  tokens after the rest of it.
* ReTerm (`job = 'reterm'`): `model`; SFT `sft.batch` x `sft.length`; GRPO `grpo.batch` rows
  (groups of `grpo.group_size`) of `sft.length` tokens (its stages' `grpo.length`); micro-batches
  of `sft/grpo.micro_batch_rows` rows (0: `train.num_micro_batches`); the sampler as above with
  `concurrency` and `eval.max_output_tokens`, caching `eval.context` tokens (0: the model's).
"""

from __future__ import annotations

import ml_collections

from tr.models.config import get_model_config
from tr.stages.actor import MIN_SLOTS
from tr.stages.stage_config import stage_defaults
from tr.stages.registry import ConfigError
from tr.train.updates import default_config

# stage kinds -> the updates they run (tr.stages.registry.STAGE_KINDS)
KIND_UPDATES = {"rpr": ("critic", "ppo"), "warmup": ("critic",), "rsr": ("sft",), "base": ("sft",),
                "sft": ("sft",), "reterm_sft": ("sft",), "grpo": ("grpo",),
                "reterm_grpo": ("grpo",)}


def _overlay(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _overlay(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def _micro_batches(rows: int, micro_batch_rows: int, num_micro_batches: int) -> int:
    return rows // micro_batch_rows if micro_batch_rows > 0 else max(1, num_micro_batches)


def _sampler(concurrency: int, context: int, new_tokens: int) -> dict:
    return {"rows": max(MIN_SLOTS, concurrency), "prompt_len": context - new_tokens,
            "new_tokens": new_tokens}


def experiment_plan(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The aot interface of `config` (module docstring); `ConfigError` when it has none."""
    if "shapes" in config:
        return config
    plan = ml_collections.ConfigDict()
    plan.pod = config.pod if "pod" in config else ml_collections.ConfigDict()
    if "aot" in config:
        plan.aot = config.aot
    if "stages" in config and "stage_defaults" in config:
        d = ml_collections.ConfigDict(_overlay(stage_defaults().to_dict(),
                                               config.stage_defaults.to_dict()))
        name = d.model.name or "gym"
        overrides = dict(d.model.overrides or {})
        plan.model = ml_collections.ConfigDict({"name": name, "overrides": overrides})
        plan.train = d.train
        context = get_model_config(name, **overrides).max_seq_len
        rows, length = int(d.arrays.rows), int(d.arrays.length)
        micro = _micro_batches(rows, int(d.train.micro_batch_rows), int(d.train.num_micro_batches))
        shapes = {}
        for entry in config.stages:
            for update in KIND_UPDATES.get(entry["kind"], ()):
                shapes[update] = {"rows": rows, "length": length, "micro_batches": micro}
        shapes["sampler"] = _sampler(int(d.rollout.concurrency), context,
                                     int(d.rollout.max_output_tokens))
    elif config.get("job") == "reterm":
        plan.model = ml_collections.ConfigDict({"name": config.model, "overrides": {}})
        plan.train = default_config()
        plan.train.grpo.group_size = int(config.grpo.group_size)
        context = int(config.eval.context) or get_model_config(config.model).max_seq_len
        nmb = int(plan.train.num_micro_batches)
        sft_rows, grpo_rows = int(config.sft.batch), int(config.grpo.batch)
        shapes = {"sft": {"rows": sft_rows, "length": int(config.sft.length),
                          "micro_batches": _micro_batches(sft_rows, int(config.sft.micro_batch_rows), nmb)},
                  "grpo": {"rows": grpo_rows, "length": int(config.sft.length),
                           "micro_batches": _micro_batches(grpo_rows, int(config.grpo.micro_batch_rows), nmb)},
                  "sampler": _sampler(int(config.concurrency), context,
                                      int(config.eval.max_output_tokens))}
    else:
        raise ConfigError("the config has neither `shapes` (tr/train/aot.py's interface) nor a "
                          "recipe's stages (`stages` + `stage_defaults`, or job 'reterm') to "
                          "derive them from")
    plan.shapes = shapes
    return plan
