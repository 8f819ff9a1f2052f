"""Stage kind `warmup` (SPEC §6): the actor frozen, the critic (fresh or from a named stage) trained
for one epoch on rollouts of the current actor on held-apart `train` tasks.

Each iteration is one rollout batch and `train.ppo.epochs x mini_batches` critic updates on it, with
targets (`V_old`, TB-GAE returns) computed once; every update's metrics line carries the explained
variance of the batch's returns under the critic before the iteration (`ev_before`) and after it
(`ev_after`), and the summary the first and last (the paper: −1.15 → 0.01).

Config (on top of `tr.stages.stage_config.stage_defaults`): `warmup.tasks` (how many `train` tasks are
held apart for the warm-up, taken from the end of the split; 0 = all).
"""

from __future__ import annotations

import jax
import ml_collections

from tr.rl import advantages as adv_lib
from tr.stages import handoff, loop
from tr.stages.actor import Actor
from tr.stages.metrics import finite_or_none, read_metrics
from tr.stages.splits import stage_tasks
from tr.stages.stage_config import resolve_stage_config, stage_defaults
from tr.stages.stage_rewards import episode_rewards
from tr.train import updates
from tr.train.compile import run_epochs

KIND = "warmup"


def defaults() -> ml_collections.ConfigDict:
    config = stage_defaults()
    config.kind = KIND
    config.critic_from = "fresh"
    config.warmup = {"tasks": 0}
    config.eval.every = 0          # the actor does not change: evaluate once, at the start
    return config


def run(stage_config, run_dir, **_) -> dict:
    config = resolve_stage_config(stage_config, defaults())
    done = handoff.finished_summary(run_dir, config.name)
    if done is not None:
        return done
    opened = handoff.open_stage(config, run_dir, kind=KIND, actor_trains=False, critic_trains=True)
    train_tasks = stage_tasks(config.tasks, "train")
    held = int(config.warmup.tasks)
    tasks = train_tasks[-held:] if held else train_tasks
    ppo = config.train.ppo
    per_iteration = int(config.rollout.tasks_per_iteration)
    iterations = -(-len(tasks) // per_iteration)          # one epoch over the warm-up tasks

    def update(state, prepared, seed):
        state, history = run_epochs(opened.steps.critic, state, prepared, epochs=int(ppo.epochs),
                                    mini_batches=int(ppo.mini_batches), seed=seed,
                                    micro_batch_rows=int(config.train.micro_batch_rows))
        # the compiled targets step (the loop's own executable), not an eager forward pass
        batch = {k: v for k, v in prepared.items() if k not in updates.TARGET_FIELDS}
        values_after = opened.steps.targets(state, batch)["old_values"]
        ev_after = float(adv_lib.explained_variance(prepared["returns"], values_after,
                                                    prepared["actor_mask"]))
        ev_before = float(adv_lib.explained_variance(prepared["returns"], prepared["old_values"],
                                                     prepared["actor_mask"]))
        return state, [{**m, "ev_before": ev_before, "ev_after": ev_after} for m in history]

    phases = [loop.Phase("critic", iterations, int(ppo.epochs) * int(ppo.mini_batches), update)]
    with Actor(opened.models, config.rollout, config.eval) as actor:
        parts = loop.LoopParts(
            stage_dir=opened.stage_dir, config=config, actor=actor, targets=opened.steps.targets,
            train_tasks=tasks, val_tasks=stage_tasks(config.tasks, "val")[
                :int(config.eval.count) or None] if config.eval.at_start else [],
            rewards=lambda records: episode_rewards(records, "strict"))
        state = loop.train_loop(parts, opened.state, opened.store, phases)
    lines = read_metrics(opened.stage_dir / "metrics.jsonl")
    summary = {"kind": KIND, "iterations": iterations, "updates": len(lines),
               "ev_before": lines[0]["ev_before"] if lines else None,
               "ev_after": lines[-1]["ev_after"] if lines else None,
               "ev_per_update": [finite_or_none(line["critic/explained_variance"])
                                 for line in lines]}
    jax.block_until_ready(state.step)
    return handoff.finish_stage(opened, state, summary)
