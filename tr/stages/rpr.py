"""Stage kind `rpr` (SPEC §6): actor-critic PPO from the previous actor and the inherited critic.

    set-up   open the stage (actor from `actor_from`'s retained step, critic from `critic_from`),
             profile the family scale table from the actor's rollouts (`scales.json`, next to the
             checkpoints; frozen for the stage, read back on resume)
    phase 1  `rpr.calibration_updates` (4) iterations of one critic-only update, the actor frozen
    phase 2  `rpr.iterations` iterations of joint PPO: `train.ppo.epochs x mini_batches` updates
             per rollout batch, targets computed once per batch (TB-GAE with γ_turn, λ_turn, or
             token GAE: `train.ppo.estimator`)
    rewards  `rpr.reward`: a registered reward (`tr.rewards.registry`: fdr | spr | strict),
             with the profiled table where it reads one
    launch   `rollout.oversample` extra rollouts, the first N to finish kept (the engine's keep-first;
             the paper's 288 → 256)
    retain   the step with the best `val` Pass@1 (`summary.json: retained_step`), never `test`
"""

from __future__ import annotations

import ml_collections

from tr.stages import handoff, loop
from tr.stages.actor import Actor, cached_rollouts
from tr.stages.metrics import finite_or_none, read_metrics, to_host
from tr.stages.splits import stage_tasks
from tr.stages.stage_config import check_on_policy, resolve_stage_config, stage_defaults
from tr.stages.stage_rewards import episode_rewards, profile_scales, reward_kind
from tr.train.compile import run_epochs

KIND = "rpr"


def defaults() -> ml_collections.ConfigDict:
    config = stage_defaults()
    config.kind = KIND
    config.rpr = {"calibration_updates": 4, "iterations": 20, "reward": "fdr",
                  "profile_tasks": 0, "quantile": 0.9, "failure_threshold": 1.0}
    return config


def check_config(config) -> None:
    """The value checks of an `rpr` stage config (before anything runs): a registered reward, on-policy
    sampling; ConfigError names the field."""
    reward_kind(config.rpr.reward, f"stage {config.name!r}: rpr.reward")
    check_on_policy(config)


def run(stage_config, run_dir, **_) -> dict:
    config = resolve_stage_config(stage_config, defaults())
    done = handoff.finished_summary(run_dir, config.name)
    if done is not None:
        return done
    check_config(config)
    opened = handoff.open_stage(config, run_dir, kind=KIND, actor_trains=True, critic_trains=True)
    train_tasks = stage_tasks(config.tasks, "train")
    val_tasks = stage_tasks(config.tasks, "val")[:int(config.eval.count) or None]
    with Actor(opened.models, config.rollout, config.eval) as actor:
        actor.sync(opened.state.actor_params)

        scales = None
        if reward_kind(config.rpr.reward, "rpr.reward").needs_scales:
            profile_tasks = train_tasks[:int(config.rpr.profile_tasks) or None]
            records, _ = cached_rollouts(
                opened.stage_dir / "profile-rollouts.jsonl",
                lambda: actor.rollouts(profile_tasks, seed=int(config.seed) * 1_000_003 - 1,
                                       group_size=int(config.rollout.group_size), prefix="profile"))
            scales = profile_scales(records, opened.stage_dir / "scales.json",
                                    quantile=float(config.rpr.quantile),
                                    failure_threshold=float(config.rpr.failure_threshold))

        ppo = config.train.ppo
        steps = opened.steps

        def calibrate(state, prepared, seed):
            del seed
            state, metrics = steps.critic(state, prepared)
            return state, [to_host(metrics)]

        def joint(state, prepared, seed):
            return run_epochs(steps.ppo, state, prepared, epochs=int(ppo.epochs),
                              mini_batches=int(ppo.mini_batches), seed=seed,
                              micro_batch_rows=int(config.train.micro_batch_rows))

        phases = [loop.Phase("calibration", int(config.rpr.calibration_updates), 1, calibrate),
                  loop.Phase("ppo", int(config.rpr.iterations), int(ppo.epochs) * int(ppo.mini_batches),
                             joint)]
        parts = loop.LoopParts(
            stage_dir=opened.stage_dir, config=config, actor=actor, targets=steps.targets,
            train_tasks=train_tasks, val_tasks=val_tasks,
            rewards=lambda records: episode_rewards(records, config.rpr.reward, scales))
        state = loop.train_loop(parts, opened.state, opened.store, phases)
        lines = read_metrics(opened.stage_dir / "metrics.jsonl")
        evals = loop.EvalLog(opened.stage_dir)
        retained = evals.retained()
        val = evals.lines()
        summary = {
            "kind": KIND, "updates": len(lines), "reward": config.rpr.reward,
            "scales": None if scales is None else str(opened.stage_dir / "scales.json"),
            "ev_per_update": [finite_or_none(line.get("critic/explained_variance"))
                              for line in lines],
            "val_pass@1_before": val[0]["pass@1"] if val else None,
            "val_pass@1_after": val[-1]["pass@1"] if val else None,
            "retained_step": None if retained is None else retained["step"],
            "retained_val_pass@1": None if retained is None else retained["pass@1"],
        }
        return handoff.finish_stage(opened, state, summary)
