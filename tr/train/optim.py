"""Optimizers: optax chains built from an ml_collections config (one per side, actor and critic).

`optimizer_config(lr, clip)` is one side's section; `make_optimizer` turns it into
`clip_by_global_norm` (if set) then AdamW on the schedule `make_schedule` names.
"""

from __future__ import annotations

import ml_collections
import optax


def optimizer_config(learning_rate: float, grad_clip_norm: float | None) -> ml_collections.ConfigDict:
    """One side's optimizer: AdamW on a schedule, after clipping by global norm (None: no clip)."""
    return ml_collections.ConfigDict({
        "learning_rate": learning_rate,
        "schedule": "constant",  # constant | warmup_constant | warmup_cosine
        "warmup_steps": 0,
        "decay_steps": 1000,     # warmup_cosine: steps from the start to the end of the decay
        "end_learning_rate_factor": 0.0,
        "b1": 0.9,
        "b2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "grad_clip_norm": ml_collections.FieldReference(grad_clip_norm, field_type=float),
    })


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """The learning-rate schedule named by `config.schedule`."""
    lr, warmup = float(config.learning_rate), int(config.warmup_steps)
    if config.schedule == "constant":
        return optax.constant_schedule(lr)
    if config.schedule == "warmup_constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup, 1)), optax.constant_schedule(lr)], [warmup])
    if config.schedule == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup, max(int(config.decay_steps), warmup + 1),
            end_value=lr * float(config.end_learning_rate_factor))
    raise ValueError(f"optimizer schedule {config.schedule!r} unknown; expected one of "
                     "'constant', 'warmup_constant', 'warmup_cosine'")


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """`clip_by_global_norm(grad_clip_norm)` (if set) then AdamW with `make_schedule(config)`
    (a constant rate as a hyperparameter of the state, `optax.inject_hyperparams`)."""
    for field in ("learning_rate", "b1", "b2", "eps", "weight_decay"):
        value = config[field]
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"optimizer config field {field!r} must be a number >= 0, got {value!r}")
    parts = []
    if config.grad_clip_norm is not None:
        if config.grad_clip_norm <= 0:
            raise ValueError(f"optimizer config grad_clip_norm must be > 0 or None, got "
                             f"{config.grad_clip_norm!r}")
        parts.append(optax.clip_by_global_norm(float(config.grad_clip_norm)))
    if config.schedule == "constant":
        # The rate lives in the optimizer state, not in the compiled step: stages that differ only
        # in a constant rate (RPR-2's actor lr / 5) share one executable (the persistent cache).
        adamw = optax.inject_hyperparams(optax.adamw, static_args=("b1", "b2", "eps",
                                                                    "weight_decay"))
        parts.append(adamw(float(config.learning_rate), b1=config.b1, b2=config.b2,
                           eps=config.eps, weight_decay=config.weight_decay))
    else:
        parts.append(optax.adamw(make_schedule(config), b1=config.b1, b2=config.b2,
                                 eps=config.eps, weight_decay=config.weight_decay))
    return optax.chain(*parts)
