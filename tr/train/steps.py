"""Compatibility re-exports: the update steps now live in rooms named for what they hold.

| what                                            | where                      |
|-------------------------------------------------|----------------------------|
| the pure updates, `default_config`, targets     | `tr.train.updates`         |
| `build_steps`, `UpdateSteps`, `run_epochs`      | `tr.train.compile`         |
| optimizers and schedules                        | `tr.train.optim`           |
| micro-batch split / map / accumulate            | `tr.train.microbatch`      |
| `nnx_model_fns`, `ModelFns`                     | `tr.train.model_fns`       |
| state / batch shardings on a mesh               | `tr.train.shardings`       |
| GRPO row advantages                             | `tr.rl.advantages`         |
| estimators and policy losses by name            | `tr.rl.registry`           |

New code imports from those modules; this one keeps older imports (`from tr.train import steps`)
working.
"""

from __future__ import annotations

from tr.rl.advantages import grpo_row_advantages
from tr.train.compile import UpdateSteps, build_steps, mini_batch_order, run_epochs
from tr.train.microbatch import (
    accumulate, map_micro_batches, merge_micro_batches, split_micro_batches,
)
from tr.train.model_fns import ActorFn, Batch, CriticFn, ModelFns, PyTree, nnx_model_fns
from tr.train.optim import make_optimizer, make_schedule, optimizer_config
from tr.train.shardings import nnx_param_shardings, shard_batch, train_state_shardings
from tr.train.updates import (
    REQUIRED as _REQUIRED, TARGET_FIELDS, critic_targets, critic_update, default_config,
    grpo_update, ppo_update, rollout_targets, sft_update,
)

__all__ = [
    "ActorFn", "Batch", "CriticFn", "ModelFns", "PyTree", "TARGET_FIELDS", "UpdateSteps",
    "accumulate", "build_steps", "critic_targets", "critic_update", "default_config",
    "grpo_advantages_for_rows", "grpo_row_advantages", "grpo_update", "make_optimizer",
    "make_schedule", "map_micro_batches", "merge_micro_batches", "mini_batch_order",
    "nnx_model_fns", "nnx_param_shardings", "optimizer_config", "ppo_update", "rollout_targets",
    "run_epochs", "sft_update", "shard_batch", "split_micro_batches", "train_state_shardings",
]


def grpo_advantages_for_rows(rewards, actor_mask, group_size: int, std_eps: float):
    """Former name of `tr.rl.advantages.grpo_row_advantages`."""
    return grpo_row_advantages(rewards, actor_mask, group_size=group_size, std_eps=std_eps)
