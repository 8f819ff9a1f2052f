"""Stage kind `rsr` (SPEC §6): recursive self-rewriting, actor only.

    set-up   open the stage: the actor from `actor_from`'s retained step; the critic, when
             `critic_from` names a stage, passes through frozen (its hash is recorded at the start
             and checked at every save and at the end: Δφ|RSR = 0)
    explore  `rsr.explore_k` (K = 4) rollouts of the current actor per train task   explore.jsonl
    keep     the verified successes (V_x(τ) = 1, counted episodes)
    plan     each success cleaned (failed and no-op commands dropped) -> planner -> runbook b
    review   reviewer gate q(x, b) (leaks: test names/contents, verifier paths, test-only values,
             reads of /tests or the solution; schema)                             runbooks.jsonl
    replay   each accepted runbook (distinct per task) run `rsr.replay_m` (M = 4) times fresh, the
             runbook appended to the task                                         replays.jsonl
    accept   a = V · q_leak on each replay (`tr.agent.runbook.replay_leaks`)
    sample   `rsr.per_task` accepted replays per task, uniformly (seeded)         dataset.json
    SFT      on the sampled replays with the PLAIN task prompt (runbook removed), loss on the
             actor's tokens only: `rsr.epochs` passes of `rsr.batch` rows; `val` evaluated at step
             0, every `eval.every` updates and at the end; retained step = best `val` Pass@1

Explore, plan and replay use the stage's initial actor; their files are written before any update,
so a stage killed anywhere (SIGKILL included) resumes: finished data phases are read back, SFT
continues from the last checkpoint with the same data order (a pure function of seed and step),
metrics lines past the checkpoint are dropped.

Config (on top of `tr.stages.stage_config.stage_defaults`): `rsr.*` below; the SFT optimizer is
`train.actor.optimizer`; rows are `arrays.length` tokens long.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import time

import jax
import ml_collections
import numpy as np

from tr.agent import runbook as rb
from tr.agent.records import episode_to_sequences
from tr.agent.transcript import ChatLayout
from tr.data.episodes import padded_batches
from tr.stages import handoff, loop
from tr.stages.actor import Actor, cached_rollouts
from tr.stages.evalcache import evaluate_split
from tr.stages.metrics import MetricsLog, read_metrics, rollout_summary, to_host
from tr.stages.registry import ConfigError
from tr.stages.splits import stage_tasks
from tr.stages.stage_config import resolve_stage_config, stage_defaults

KIND = "rsr"


def defaults() -> ml_collections.ConfigDict:
    config = stage_defaults()
    config.kind = KIND
    config.rsr = {
        "tasks": 32,           # train tasks explored (the first of the split; 0 = all)
        "explore_k": 4,        # K rollouts per task (SPEC §6)
        "replay_m": 4,         # M replays per accepted runbook (SPEC §6)
        "per_task": 1,         # accepted replays drawn uniformly per task into Q_clean
        # then at most this many per task family, drawn uniformly (0: no cap).  A deviation from
        # SPEC §6 for a pool of generated families: without it the family the actor already
        # solves fills Q_clean (move-logs 32 of 52 rows on the gym, 6 Dec)
        "per_family": 0,
        "planner": "embedded",     # embedded (CommandListPlanner) | http (HttpPlanner)
        "reviewer": "embedded",    # embedded (LeakRuleReviewer) | http (HttpReviewer)
        "http": {"base_url": "", "model": "", "api_key_env": "OPENAI_API_KEY",
                 "timeout_s": 120.0},
        "epochs": 2,           # SFT passes over Q_clean
        "batch": 8,            # rows (one replay each) per SFT update
        # explore and replay sampling: 0 = the training rollouts' (`rollout.temperature`/`top_p`);
        # RSR is SFT on verified successes, no importance ratio, so it may sample as the harness
        # is evaluated (SPEC §6: 0.6 / 0.95)
        "temperature": 0.0,
        "top_p": 0.0,
    }
    config.train.actor.optimizer.learning_rate = 3e-4   # SFT on a few replays (Base used 3e-3)
    config.eval.every = 0      # 0: at the start and at the end only
    return config


def check_config(config) -> None:
    """The value checks of an `rsr` stage config (before anything runs); ConfigError names the field."""
    r = config.rsr
    for field in ("explore_k", "replay_m", "per_task", "epochs", "batch"):
        if int(r[field]) < 1:
            raise ConfigError(f"stage {config.name!r}: rsr.{field} must be >= 1, got "
                              f"{r[field]}")
    if int(r.per_family) < 0:
        raise ConfigError(f"stage {config.name!r}: rsr.per_family must be >= 0 (0: no "
                          f"cap), got {r.per_family}")
    if float(r.temperature) < 0:
        raise ConfigError(f"stage {config.name!r}: rsr.temperature must be >= 0 (0: the "
                          f"rollout's), got {r.temperature}")
    if not 0 <= float(r.top_p) <= 1:
        raise ConfigError(f"stage {config.name!r}: rsr.top_p must be in [0, 1] (0: the "
                          f"rollout's), got {r.top_p}")
    if r.planner not in rb.PLANNERS:
        raise ConfigError(f"stage {config.name!r}: rsr.planner = {r.planner!r}; expected "
                          f"one of {rb.PLANNERS}")
    if r.reviewer not in rb.REVIEWERS:
        raise ConfigError(f"stage {config.name!r}: rsr.reviewer = {r.reviewer!r}; expected "
                          f"one of {rb.REVIEWERS}")
    if "http" in (r.planner, r.reviewer) and not (r.http.base_url and r.http.model):
        raise ConfigError(f"stage {config.name!r}: an http planner/reviewer needs "
                          "rsr.http.base_url and rsr.http.model")


def explore_sampling(config) -> dict:
    """The explore and replay sampling: `rsr.temperature` / `rsr.top_p`, each 0 meaning the
    training rollouts' (`rollout.temperature` / `rollout.top_p`)."""
    r, rollout = config.rsr, config.rollout
    return {"temperature": float(r.temperature) or float(rollout.temperature),
            "top_p": float(r.top_p) or float(rollout.top_p)}


def _http_kwargs(config) -> dict:
    h = config.rsr.http
    return {"base_url": h.base_url, "model": h.model, "api_key_env": h.api_key_env,
            "timeout_s": float(h.timeout_s), "seed": int(config.seed)}


def _write_json(path: pathlib.Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    tmp.replace(path)


def plan_and_review(successes, tasks_by_id, planner, reviewer) -> list[dict]:
    """One entry per success: its cleaned steps' commands, the runbook, the reviewer's verdict."""
    out = []
    for record in successes:
        task = tasks_by_id[record.task_id]
        steps = rb.clean_steps(record)
        runbook = planner.plan(task, steps)
        verdict = reviewer.review(task, runbook)
        out.append({"task_id": record.task_id, "episode_id": record.episode_id,
                    "commands": [s.command for s in steps], "runbook": runbook,
                    "accept": verdict.accept, "reasons": list(verdict.reasons),
                    "planner": planner.name, "reviewer": reviewer.name})
    return out


def replay_tasks(entries: list[dict], tasks_by_id) -> list:
    """The distinct accepted runbooks of each task as tasks `<task id>@rb<j>` whose instruction
    carries the runbook (`rb.with_runbook`)."""
    out, seen = [], collections.defaultdict(list)
    for entry in entries:
        if not entry["accept"] or entry["runbook"] in seen[entry["task_id"]]:
            continue
        j = len(seen[entry["task_id"]])
        seen[entry["task_id"]].append(entry["runbook"])
        task = rb.with_runbook(tasks_by_id[entry["task_id"]], entry["runbook"])
        out.append(dataclasses.replace(task, id=f"{entry['task_id']}@rb{j}"))
    return out


def accepted_replays(replays, replay_by_id, tasks_by_id) -> tuple[list, dict]:
    """`(accepted, leaks)`: replays with a = V · q_leak = 1, and the leak findings of the rest."""
    accepted, leaks = [], {}
    for record in replays:
        if not (record.status.counts and record.passed):
            continue
        base_id = replay_by_id[record.task_id]
        found = rb.replay_leaks(record, rb.TaskSecrets.of(tasks_by_id[base_id]))
        if found:
            leaks[record.episode_id] = found
        else:
            accepted.append(record)
    return accepted, leaks


def _draw(pool: list, count: int, seed: int, key: str) -> list:
    """Up to `count` of `pool`, uniformly without replacement, seeded by `seed` and `key`."""
    rng = np.random.default_rng([seed, int.from_bytes(key.encode()[:8], "little")])
    pick = rng.choice(len(pool), size=min(count, len(pool)), replace=False)
    return [pool[int(i)] for i in sorted(pick)]


def sample_clean(accepted, replay_by_id, per_task: int, seed: int, per_family: int = 0) -> list:
    """Q_clean: up to `per_task` accepted replays per task, drawn uniformly without replacement
    (seeded by `seed` and the task id, so it does not depend on the order replays finished); then,
    when `per_family` > 0, up to `per_family` of each family's drawn replays (seeded by the family)."""
    by_task = collections.defaultdict(list)
    for record in sorted(accepted, key=lambda r: r.episode_id):
        by_task[replay_by_id[record.task_id]].append(record)
    out = []
    for task_id in sorted(by_task):
        out.extend(_draw(by_task[task_id], per_task, seed, task_id))
    if per_family <= 0:
        return out
    by_family = collections.defaultdict(list)
    for record in out:
        by_family[record.family].append(record)
    return [record for family in sorted(by_family)
            for record in _draw(by_family[family], per_family, seed, "family:" + family)]


def sft_sequences(records, layout, system_prompt: str, replay_tasks_by_id, tasks_by_id,
                  replay_by_id, length: int) -> tuple[list[dict], int]:
    """The SFT sequences of Q_clean on the plain task prompt (loss on the actor's tokens); those
    longer than `length` are dropped (counted)."""
    seqs, dropped = [], 0
    for record in records:
        plain = rb.plain_prompt(record, layout, system_prompt,
                                replay_tasks_by_id[record.task_id].instruction,
                                tasks_by_id[replay_by_id[record.task_id]].instruction)
        for seq in episode_to_sequences(plain, 1.0, loss_sources=("policy",)):
            if len(seq["tokens"]) <= length:
                seqs.append(seq)
            else:
                dropped += 1
    return seqs, dropped


def run(stage_config, run_dir, **_) -> dict:
    config = resolve_stage_config(stage_config, defaults())
    done = handoff.finished_summary(run_dir, config.name)
    if done is not None:
        return done
    check_config(config)
    t_start = time.monotonic()
    opened = handoff.open_stage(config, run_dir, kind=KIND, actor_trains=True, critic_trains=False,
                                critic_frozen=bool(config.critic_from))
    stage_dir, models, state = opened.stage_dir, opened.models, opened.state
    r = config.rsr
    seed = int(config.seed)
    train_tasks = stage_tasks(config.tasks, "train")[:int(r.tasks) or None]
    val_tasks = stage_tasks(config.tasks, "val")[:int(config.eval.count) or None]
    tasks_by_id = {t.id: t for t in train_tasks}
    sampling = explore_sampling(config)
    with Actor(models, config.rollout, config.eval) as actor:
        log = MetricsLog(stage_dir / "metrics.jsonl")
        evals = loop.EvalLog(stage_dir)
        times = {}

        def evaluate(step_state) -> None:
            step = int(jax.device_get(step_state.step))
            if evals.has(step) or not val_tasks:
                return
            actor.sync(step_state.actor_params)
            summary = evaluate_split(actor, val_tasks, config.eval, seed=10_000 + seed,
                                     cache_dir=stage_dir.parent / "val-evaluations")
            line = evals.add(step, step, summary)
            log.progress(f"{config.name}: val at step {step}: pass@1 {line['pass@1']}")

        # The data phases use the stage's initial actor; a resumed stage past step 0 reads them back.
        start_step = int(jax.device_get(state.step))
        if start_step == 0:
            actor.sync(state.actor_params)
            if config.eval.at_start:
                evaluate(state)
            actor.sync(state.actor_params)
        t0 = time.monotonic()
        explored, explore_stats = cached_rollouts(
            stage_dir / "explore.jsonl",
            lambda: _initial_only(start_step) or actor.rollouts(
                train_tasks, seed=seed * 1_000_003 + 1, group_size=int(r.explore_k),
                prefix="explore", **sampling))
        times["explore_s"] = time.monotonic() - t0
        successes = [x for x in explored if x.status.counts and x.passed]

        t0 = time.monotonic()
        runbooks_path = stage_dir / "runbooks.jsonl"
        if runbooks_path.exists():
            entries = [json.loads(x) for x in runbooks_path.read_text().splitlines() if x.strip()]
        else:
            planner = rb.make_planner(r.planner, **(_http_kwargs(config) if r.planner == "http" else {}))
            reviewer = rb.make_reviewer(r.reviewer,
                                        **(_http_kwargs(config) if r.reviewer == "http" else {}))
            entries = plan_and_review(successes, tasks_by_id, planner, reviewer)
            tmp = runbooks_path.with_name(runbooks_path.name + ".tmp")
            tmp.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
            tmp.replace(runbooks_path)
        times["plan_s"] = time.monotonic() - t0

        t0 = time.monotonic()
        to_replay = replay_tasks(entries, tasks_by_id)
        replay_by_id = {t.id: t.id.rsplit("@rb", 1)[0] for t in to_replay}
        replay_tasks_by_id = {t.id: t for t in to_replay}
        if to_replay:
            replays, replay_stats = cached_rollouts(
                stage_dir / "replays.jsonl",
                lambda: _initial_only(start_step) or actor.rollouts(
                    to_replay, seed=seed * 1_000_003 + 2, group_size=int(r.replay_m),
                    prefix="replay", **sampling))
        else:
            replays, replay_stats = [], {"launched": 0, "kept": 0}
        times["replay_s"] = time.monotonic() - t0
        accepted, leaks = accepted_replays(replays, replay_by_id, tasks_by_id)
        clean = sample_clean(accepted, replay_by_id, int(r.per_task), seed, int(r.per_family))
        layout = ChatLayout(models.tokenizer)
        length = int(config.arrays.length)
        seqs, too_long = sft_sequences(clean, layout, models.system_prompt, replay_tasks_by_id,
                                       tasks_by_id, replay_by_id, length)
        per_epoch = -(-len(seqs) // int(r.batch)) if seqs else 0
        total = per_epoch * int(r.epochs)
        reasons = collections.Counter(reason.split(" '")[0] for e in entries for reason in e["reasons"])
        data = {
            "tasks": len(train_tasks), "explored": len(explored),
            "explore_pass_rate": rollout_summary(explored, [0.0] * len(explored))["pass_rate"],
            "successes": len(successes), "tasks_with_success": len({x.task_id for x in successes}),
            "runbooks": len(entries), "runbooks_accepted": sum(e["accept"] for e in entries),
            "reject_reasons": dict(reasons), "replayed_runbooks": len(to_replay),
            "replays": len(replays), "replay_passes": sum(bool(x.passed) for x in replays),
            "replay_leaks": len(leaks), "accepted_replays": len(accepted), "q_clean": len(clean),
            "q_clean_tasks": len({replay_by_id[x.task_id] for x in clean}),
            "q_clean_episodes": [x.episode_id for x in clean], "sequences": len(seqs),
            "too_long": too_long, "updates": total, "sampling": sampling,
            "q_clean_families": dict(collections.Counter(x.family for x in clean)),
            "explore_rollouts": explore_stats, "replay_rollouts": replay_stats,
        }
        _write_json(stage_dir / "dataset.json", data)
        log.progress(f"{config.name}: explored {len(explored)} ({len(successes)} passed), runbooks "
                     f"{data['runbooks_accepted']}/{len(entries)} accepted, replays "
                     f"{data['replay_passes']}/{len(replays)} passed, {len(leaks)} leaked, "
                     f"Q_clean {len(clean)} -> {total} updates")

        # SFT on Q_clean (plain prompts), checkpointed; resumes at the checkpoint's step.
        t0 = time.monotonic()
        step = int(jax.device_get(state.step))
        log.truncate(step)
        if step > 0 and _eval_due(step - 1, total, int(config.eval.every)):
            evaluate(state)        # killed after saving this step, before evaluating it
        rows = padded_batches(seqs, batch=int(r.batch), length=length, seed=seed) if seqs else None
        while step < total:
            batch = rows[step]
            state, metrics = opened.steps.sft(state, {k: jax.numpy.asarray(v)
                                                      for k, v in batch.items()})
            metrics = to_host(metrics)
            log.write([{"stage": config.name, "iteration": step, "step": step + 1, "phase": "sft",
                        "rows": int(batch["loss_mask"].any(axis=1).sum()),
                        "loss_tokens": int(batch["loss_mask"].sum()), **metrics}])
            opened.store.save(state, force=step + 1 == total)
            step += 1
            if step % max(1, total // 4) == 0 or step == total:
                log.progress(f"{config.name} sft {step}/{total}: loss {metrics['actor/loss']:.3f}",
                             done=step, total=total)
            if _eval_due(step - 1, total, int(config.eval.every)):
                opened.store.save(state, force=True)
                evaluate(state)
        opened.store.wait()
        times["sft_s"] = time.monotonic() - t0
        if total == 0 and config.eval.at_start:
            evaluate(state)
        retained = evals.retained()
        val = evals.lines()
        lines = read_metrics(stage_dir / "metrics.jsonl")
        summary = {
            "kind": KIND, **{k: v for k, v in data.items() if k != "q_clean_episodes"},
            "planner": r.planner, "reviewer": r.reviewer,
            "sft_loss_first": lines[0]["actor/loss"] if lines else None,
            "sft_loss_last": lines[-1]["actor/loss"] if lines else None,
            "val_pass@1_before": val[0]["pass@1"] if val else None,
            "val_pass@1_after": val[-1]["pass@1"] if val else None,
            "retained_step": None if retained is None else retained["step"],
            "retained_val_pass@1": None if retained is None else retained["pass@1"],
            "critic_frozen": bool(config.critic_from), "wall_s": time.monotonic() - t_start, **times,
        }
        out = handoff.finish_stage(opened, state, summary)
        if config.critic_from:
            manifest = json.loads((stage_dir / "stage.json").read_text())
            if manifest["critic_hash_before"] != manifest["critic_hash_after"]:
                raise RuntimeError(f"stage {config.name!r}: the critic changed during RSR")
        return out


def _initial_only(step: int):
    """Data phases run from the initial actor only: a stage past step 0 must find their files."""
    if step:
        raise RuntimeError(f"RSR data file missing at step {step}: its explore/replay files were "
                           "deleted after training started; delete the stage folder to rerun it")
    return None


def _eval_due(index: int, total: int, every: int) -> bool:
    return index + 1 == total or (every > 0 and (index + 1) % every == 0)
