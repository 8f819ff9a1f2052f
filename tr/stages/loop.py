"""The training loop every RL stage runs, top to bottom:

    for each rollout batch (iteration) not yet checkpointed:
        records  = rollouts of the current actor on this iteration's train tasks  (kept as a shard)
        rewards  = the stage's reward of each record                              (strict/FDR/SPR)
        batch    = training arrays [rows, length] + targets computed once          (steps.targets)
                   (with train.micro_batch_rows: always arrays.rows rows, `bucket_layout`)
        state    = the phase's updates on the batch                               (epochs x minis)
        sampler  <- state.actor_params                                            (weight sync)
        metrics.jsonl <- one line per update (with the iteration's `seconds` per part); a
                         progress line on stderr
        checkpoint (stage store), then `val` evaluation when due

A stage is a list of `Phase`s (RPR: 4 critic-only calibration iterations, then PPO); the
iteration a checkpoint stands for follows from its update count. Killed at any point (SIGKILL
included), the stage resumes from its last complete checkpoint: the iteration's records are read
back from their shard if they were written (else collected again from the same parameters and
seed), metrics lines of iterations past the checkpoint are dropped, and a missed evaluation is
run; so no data is lost or used twice.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Callable, Sequence

import jax
import numpy as np

from tr.stages.actor import Actor, cached_rollouts
from tr.stages.arrays import training_arrays
from tr.stages.evalcache import evaluate_split
from tr.stages.metrics import MetricsLog, rollout_summary
from tr.stages.registry import ConfigError
from tr.stages.splits import iteration_tasks
from tr.train.microbatch import bucket_layout, data_rows
from tr.train.state import TrainState

UpdateFn = Callable[[TrainState, dict, int], tuple[TrainState, list[dict]]]


@dataclasses.dataclass(frozen=True)
class Phase:
    """`iterations` rollout batches, each trained by `update(state, prepared, iteration)`, which
    applies exactly `updates_per_iteration` optimizer updates and returns one metrics dict each."""

    name: str
    iterations: int
    updates_per_iteration: int
    update: UpdateFn


@dataclasses.dataclass
class LoopParts:
    """What a stage kind hands the loop."""

    stage_dir: pathlib.Path
    config: object                      # the resolved stage config (stage_config.stage_defaults)
    actor: Actor
    targets: Callable                   # UpdateSteps.targets
    train_tasks: Sequence
    val_tasks: Sequence
    rewards: Callable[[Sequence], np.ndarray]


def iterations_done(phases: Sequence[Phase], step: int) -> int:
    """How many iterations a checkpoint with `step` updates stands for (raises if none fits)."""
    done = updates = 0
    for phase in phases:
        for _ in range(phase.iterations):
            if updates == step:
                return done
            updates += phase.updates_per_iteration
            done += 1
    if updates == step:
        return done
    raise ValueError(f"a checkpoint at step {step} is not the end of an iteration of this stage's "
                     f"phases {[(p.name, p.iterations, p.updates_per_iteration) for p in phases]}")


class EvalLog:
    """`eval-val.jsonl` (one line per evaluation: step, pass@1, mean@k) and `eval-val.json` (the
    latest `tr.agent.evaluation.summarise` output); the retained step is the best on `val`."""

    def __init__(self, stage_dir: pathlib.Path, split: str = "val"):
        self.lines_path = stage_dir / f"eval-{split}.jsonl"
        self.latest_path = stage_dir / f"eval-{split}.json"

    def lines(self) -> list[dict]:
        if not self.lines_path.exists():
            return []
        return [json.loads(x) for x in self.lines_path.read_text().splitlines() if x.strip()]

    def has(self, step: int) -> bool:
        return any(line["step"] == step for line in self.lines())

    def add(self, step: int, iteration: int, summary: dict) -> dict:
        k = summary["k"]
        line = {"step": step, "iteration": iteration, "pass@1": summary["overall"]["pass@1"],
                f"mean@{k}": summary["overall"][f"mean@{k}"], "episodes": summary["episodes"]}
        tmp = self.latest_path.with_name(self.latest_path.name + ".tmp")
        tmp.write_text(json.dumps({"step": step, **summary}, indent=1, sort_keys=True))
        tmp.replace(self.latest_path)
        with open(self.lines_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        return line

    def retained(self) -> dict | None:
        """The evaluation with the best `val` Pass@1 (then Mean@k, then the later step)."""
        lines = self.lines()
        if not lines:
            return None

        def key(line):
            mean = next((v for k, v in line.items() if k.startswith("mean@")), None)
            return (line["pass@1"] or 0.0, mean or 0.0, line["step"])
        return max(lines, key=key)


def train_loop(parts: LoopParts, state: TrainState, store, phases: Sequence[Phase]) -> TrainState:
    """Runs the iterations of `phases` not yet in the checkpoint `state` came from."""
    config, actor = parts.config, parts.actor
    pack, mini_batches = int(config.arrays.get("pack_multiple", 0)), int(config.train.ppo.mini_batches)
    if pack % mini_batches:
        raise ConfigError(f"stage {config.name!r}: arrays.pack_multiple={pack} is not a "
                          f"multiple of train.ppo.mini_batches={mini_batches}")
    micro_rows, rows = int(config.train.get("micro_batch_rows", 0)), int(config.arrays.rows)
    if micro_rows and (rows % micro_rows or (rows // mini_batches) % micro_rows):
        raise ConfigError(f"stage {config.name!r}: arrays.rows={rows} and its mini-batches "
                          f"of {rows // mini_batches} rows must be multiples of "
                          f"train.micro_batch_rows={micro_rows}")
    schedule = [phase for phase in phases for _ in range(phase.iterations)]
    done = iterations_done(phases, int(jax.device_get(state.step)))
    log = MetricsLog(parts.stage_dir / "metrics.jsonl")
    log.truncate(done)
    evals = EvalLog(parts.stage_dir)
    actor.sync(state.actor_params)

    def evaluate(iteration: int) -> None:
        step = int(jax.device_get(state.step))
        if evals.has(step) or not parts.val_tasks:
            return
        summary = evaluate_split(actor, parts.val_tasks, config.eval,
                                 seed=10_000 + int(config.seed),
                                 cache_dir=parts.stage_dir.parent / "val-evaluations")
        line = evals.add(step, iteration, summary)
        log.progress(f"{config.name}: val at step {step}: pass@1 {line['pass@1']}")

    if done == 0 and config.eval.at_start:
        evaluate(0)
    elif done > 0 and _eval_due(done - 1, len(schedule), config.eval.every):
        evaluate(done - 1)     # the killed run saved this step but died before evaluating it
    rollout = config.rollout
    n_keep = int(rollout.tasks_per_iteration) * int(rollout.group_size)
    for iteration in range(done, len(schedule)):
        phase = schedule[iteration]
        seed = int(config.seed) * 1_000_003 + iteration
        tasks = iteration_tasks(parts.train_tasks, iteration,
                                int(rollout.tasks_per_iteration), int(config.seed))
        extra = int(rollout.oversample)
        if extra:   # N' = N + extra launched, the first N to finish kept (the engine's keep-first)
            tasks = tasks + iteration_tasks(
                parts.train_tasks, 10_000 + iteration, max(1, -(-extra // int(rollout.group_size))),
                int(config.seed))
        clock = _Clock()
        records, rollout_stats = cached_rollouts(
            parts.stage_dir / "rollouts" / f"{iteration:05d}.jsonl",
            lambda tasks=tasks, seed=seed: actor.rollouts(
                tasks, seed=seed, group_size=int(rollout.group_size),
                keep_first=n_keep if extra else None, prefix=f"it{iteration}"))
        clock.lap("rollouts")
        rewards = parts.rewards(records)
        batch, array_stats = training_arrays(
            records, rewards, rows=int(config.arrays.rows), length=int(config.arrays.length),
            num_windows=int(config.train.ppo.num_windows),
            pack_multiple=int(config.arrays.get("pack_multiple", 0)))
        if micro_rows:   # one [arrays.rows, length] shape for every batch: one compiled step
            batch = bucket_layout(batch, data_rows(batch), rows=rows, micro_batch_rows=micro_rows)
        batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}
        clock.lap("arrays")
        prepared = jax.block_until_ready({**batch, **parts.targets(state, batch)})
        clock.lap("targets")
        state, history = phase.update(state, prepared, seed)
        jax.block_until_ready(state)
        clock.lap("updates")
        actor.sync(state.actor_params)
        first_step = int(jax.device_get(state.step)) - len(history)
        shared = {"stage": config.name, "iteration": iteration, "phase": phase.name,
                  "rollouts": {**rollout_summary(records, rewards), **rollout_stats},
                  "arrays": array_stats, "seconds": clock.laps}
        log.write([{**shared, "step": first_step + i + 1, **metrics}
                   for i, metrics in enumerate(history)])
        store.save(state, force=True)
        last = history[-1] if history else {}
        log.progress(f"{config.name} it {iteration + 1}/{len(schedule)} ({phase.name}) step "
                     f"{int(jax.device_get(state.step))}: pass "
                     f"{shared['rollouts']['pass_rate']} reward {shared['rollouts']['reward_mean']}"
                     f" EV {last.get('critic/explained_variance', float('nan')):.3f}",
                     done=iteration + 1, total=len(schedule))
        if _eval_due(iteration, len(schedule), config.eval.every):
            evaluate(iteration)
    store.wait()
    log.close()
    return state


class _Clock:
    """Wall seconds per named part of an iteration (`seconds` in its metrics lines)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


def _eval_due(iteration: int, total: int, every: int) -> bool:
    return iteration + 1 == total or (every > 0 and (iteration + 1) % every == 0)
