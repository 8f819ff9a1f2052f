"""A training stage's config: the fields every stage has (`stage_defaults`), a stage entry resolved
over a kind's defaults (`resolve_stage_config`), and the on-policy check of rollout and update
temperatures."""

from __future__ import annotations

import ml_collections

from tr.stages.registry import ConfigError
from tr.train.updates import default_config


def stage_defaults() -> ml_collections.ConfigDict:
    """The fields a training stage's config has (a stage entry of `config.stages` overrides them).

    Sizes are the papers' where one is given; tests and CPU runs shrink them.
    """
    return ml_collections.ConfigDict({
        "name": "",
        "kind": "",
        "actor_from": "",          # stage name (its retained step), "" = none
        "critic_from": "",         # stage name, "fresh", "" = none
        # A fresh critic's backbone: "random" (initialised) or "actor" (the actor parent's
        # retained weights, the value head zero: the usual start of an LLM critic)
        "critic_init": "random",
        "seed": 0,
        # "" = from the actor parent's manifest (`inherit_from_parent`), else the fallback below
        "model": {"name": "", "overrides": {}},   # fallback "tiny"
        "tokenizer": "",                          # 'byte' or a tokenizer.json path; fallback 'byte'
        "system_prompt": "",                      # fallback: the harness's SYSTEM_PROMPT
        "tasks": {"source": "suite", "suite": "", "ids": [], "count": 0, "seed": 0},
        "train": default_config(),
        "rollout": {
            "backend": "local",
            "concurrency": 4,
            "tasks_per_iteration": 8,   # distinct train tasks per rollout batch
            "group_size": 1,            # rollouts per task
            "oversample": 0,            # N' − N extra launched rollouts (keep-first N)
            "max_output_tokens": 64,
            "max_turns": 4,
            "temperature": 1.0,         # training rollouts: SPEC §2
            "top_p": 1.0,
            # active summarisation: 0 = off (as Base's evaluation), -1 = the policy's threshold
            # (fits the sampler's buckets: 256 tokens at a 1,024-token context), > 0 = this many
            "summarise_at_tokens": 0,
            # an episode's whole context (prompt + output tokens): 0 = the sampler's bucket rule
            # (512 + 64 at the gym model's 1,024), > 0 = this many, up to the model's max_seq_len
            # (`ModelPolicy.budgets(context=)`)
            "context": 0,
        },
        # pack_multiple: 0 = one context window per row (padded to `length`); m > 0 = windows
        # packed several to a row into the fewest rows, a multiple of m, that hold them
        # (`training_arrays`); m must divide `rows` and be a multiple of train.ppo.mini_batches
        "arrays": {"rows": 16, "length": 1024, "pack_multiple": 0},
        # wall_time_s: an evaluation episode's wall-clock cap, far above need, so a loaded machine
        # never changes an evaluation (turns and tokens end the episodes; 0 = the task's own)
        "eval": {"every": 1, "k": 1, "count": 0, "temperature": 0.6, "top_p": 0.95,
                 "at_start": True, "wall_time_s": 1800.0},
        "checkpoint": {"save_every": 1, "async_save": False},
    })


def resolve_stage_config(entry, defaults: ml_collections.ConfigDict | None = None
                         ) -> ml_collections.ConfigDict:
    """`defaults` (a stage kind's, else `stage_defaults()`) updated by `entry` (a ConfigDict or
    dict); an unknown field raises `ConfigError` naming it."""
    config = stage_defaults() if defaults is None else defaults
    entry = entry.to_dict() if hasattr(entry, "to_dict") else dict(entry)
    try:
        config.update_from_flattened_dict(_flatten(entry))
    except (KeyError, AttributeError) as error:
        raise ConfigError(f"stage {entry.get('name', '?')!r}: unknown config field {error}") from None
    if not config.name:
        raise ConfigError(f"a stage entry has no 'name': {entry}")
    return config


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("overrides",):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def check_on_policy(config) -> None:
    """The rollouts sample from the policy the updates train: `rollout.temperature` equals
    `train.policy_temperature` τ (the updates' log-probs are log softmax(logits / τ)), else PPO's
    ratio against the behaviour log-probs compares two different policies; ConfigError names both."""
    tau = float(config.train.get("policy_temperature", 1.0))
    if not tau > 0:
        raise ConfigError(f"stage {config.name!r}: train.policy_temperature must be > 0, got {tau}")
    if abs(float(config.rollout.temperature) - tau) > 1e-6:
        raise ConfigError(f"stage {config.name!r}: rollout.temperature = "
                          f"{config.rollout.temperature} but train.policy_temperature = {tau}: the "
                          "rollouts must sample from the policy the updates train (set both)")
