"""ReTerm end to end on the gym (issue 15, SPEC §6): Base -> SFT -> GRPO -> ReTerm-GRPO.

    base         the embedded model SFT-trained on the scripted teacher's demos
                 (`tr.stages.base.make_demos`, a fixed step count; the Base actor)
    data         the Base attempts `train` tasks N times (pre-verifier snapshots); each failure is
                 continued by the teacher (embedded: inspect + gym repair; or an HTTP endpoint)
                 from its restored s_f; four filters; JSONL shards (`tr.agent.recovery`)
    heldout      failure states collected once from the Base on `test` (fixed for Recovery@k)
    reterm_sft   SFT from Base on the kept rows: input (x, h_f, r condensed), loss on teacher tokens
    grpo         GRPO from SFT: (M_O + M_R) original groups of G per update (compute-matched)
    reterm_grpo  ReTerm-GRPO from SFT: M_O original + M_R recovery groups from the queue (front
                 insert, front-first sampling, capacity K, oldest evicted with its snapshot);
                 rewards = strict pass, group-normalised advantages (population std + δ), groups
                 weighted by `grpo.group_weighting` ("equal" by default; see tr.rl.losses)
    report       per arm: Pass@1 on `test`, Recovery@k on the held-out failure states (and by
                 rule-based error category), mean turns and generated tokens per episode;
                 dataset counts and rejections per filter; queue counts; reward curves of
                 original and recovery groups -> report.json, report.md, reward_curves.png

The stages `reterm_sft` and `reterm_grpo` are :func:`run_sft` and :func:`run_grpo` (named in
:data:`STAGES`).  They take and return parameters in memory (the `reterm` job chains them); they
are not yet pipeline stage kinds (`tr.stages.registry.STAGE_KINDS`: `run(stage_config, run_dir)`
over the loop's stage store), which is the next step.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import time

import numpy as np

from tr.stages import embedded
from tr.stages.registry import ConfigError

ARMS = ("base", "sft", "grpo", "reterm_grpo")
STAGES = {"reterm_sft": "tr.stages.reterm:run_sft", "reterm_grpo": "tr.stages.reterm:run_grpo"}


# ----------------------------------------------------------------------------------------------
# The actor: one model, one sampler, parameters swapped in place.

class Actor:
    def __init__(self, model, tokenizer, *, concurrency: int, prompt_bucket: int):
        from tr.sampling.sampler import JaxSampler

        self.model, self.tokenizer = model, tokenizer
        self.sampler = JaxSampler(model, tokenizer, min_prompt_bucket=prompt_bucket,
                                  min_batch_bucket=concurrency)
        self.calls = 0

    def set_params(self, params) -> None:
        from flax import nnx

        state = nnx.state(self.model, nnx.Param)
        nnx.replace_by_pure_dict(state, params)
        nnx.update(self.model, state)
        self.sampler.update_weights(self.model)

    def policy(self, *, temperature: float, top_p: float, seed: int, name: str):
        from tr.agent.policies import ModelPolicy

        self.calls += 1
        return ModelPolicy(self.sampler, self.tokenizer, temperature=temperature, top_p=top_p,
                           seed=seed * 1000 + self.calls, name=name)


def _rollout_config(config, policy, *, snapshot: bool = False):
    from tr.agent.rollout import RolloutConfig

    budgets = policy.budgets(config.eval.max_output_tokens, max_turns=config.eval.max_turns,
                             summarise_at_tokens=None)
    return RolloutConfig(concurrency=config.concurrency, progress=False, batch_window_s=0.0,
                         budgets=budgets, snapshot_before_verify=snapshot,
                         system_prompt=embedded.SYSTEM_PROMPT)


# ----------------------------------------------------------------------------------------------
# SFT (Base and reterm_sft).

def sft_train(params, seqs, *, fns, steps: int, batch: int, length: int, lr: float, seed: int,
              pad_id: int):
    """`steps` SFT updates (loss on each sequence's `loss_mask`) from `params`; returns
    (params, losses)."""
    from tr.stages.base import batches
    from tr.train import steps as steps_lib
    from tr.train.state import create_train_state

    train_cfg = steps_lib.default_config()
    opt = train_cfg.actor.optimizer
    opt.learning_rate = lr
    sft = steps_lib.build_steps(train_cfg, actor_logprobs=fns.actor_logprobs).sft
    state = create_train_state(actor_params=params,
                               actor_optimizer=steps_lib.make_optimizer(opt), seed=seed)
    data = batches(seqs, batch=batch, length=length, pad_id=pad_id, seed=seed)
    losses = []
    for _ in range(steps):
        state, metrics = sft(state, next(data))
        losses.append(float(metrics["actor/loss"]))
    return state.actor_params, losses


def run_sft(stage_config, run_dir, *, params, fns, tokenizer) -> tuple:
    """Stage kind `reterm_sft`: SFT on the JSONL recovery shards under `stage_config.data`
    (teacher tokens only in the loss).  Returns (params, summary)."""
    from tr.agent.recovery import read_shards, sft_sequences

    t0 = time.monotonic()
    paths = sorted(pathlib.Path(stage_config.data).glob("recoveries-*.jsonl"))
    seqs = [s for s in sft_sequences(read_shards(paths)) if len(s["tokens"]) <= stage_config.length]
    if not seqs:
        raise RuntimeError(f"reterm_sft: no recovery row fits length {stage_config.length} under "
                           f"{stage_config.data}")
    params, losses = sft_train(params, seqs, fns=fns, steps=stage_config.steps,
                               batch=stage_config.batch, length=stage_config.length,
                               lr=stage_config.learning_rate, seed=stage_config.seed,
                               pad_id=tokenizer.pad_id)
    summary = {"kind": "reterm_sft", "rows": len(seqs), "steps": stage_config.steps,
               "loss_first": losses[0], "loss_last": losses[-1], "wall_s": time.monotonic() - t0}
    _write_stage(run_dir, "reterm_sft", summary, [{"step": i + 1, "loss": l}
                                                  for i, l in enumerate(losses)])
    return params, summary


def _write_stage(run_dir, name, summary, metrics) -> None:
    d = pathlib.Path(run_dir) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    with open(d / "metrics.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(m, sort_keys=True) + "\n" for m in metrics)


# ----------------------------------------------------------------------------------------------
# GRPO and ReTerm-GRPO.

def group_rows(groups, *, length: int):
    """Rows of whole groups (one rollout per row, reward = strict pass on the last actor token) and
    `is_recovery`; a group with an uncounted episode, several windows or a row longer than
    `length` is dropped whole.  Returns (batch | None, kept groups, dropped groups)."""
    from tr.agent.records import episode_to_sequences, pad_sequences

    seqs, is_rec, kept, dropped = [], [], [], 0
    for kind, recs in groups:
        rows = []
        for rec in sorted(recs, key=lambda r: r.rollout_index):
            s = episode_to_sequences(rec, float(bool(rec.passed))) if rec.status.counts else []
            if len(s) != 1 or len(s[0]["tokens"]) > length:
                rows = None
                break
            rows.append(s[0])
        if not rows:
            dropped += 1
            continue
        seqs += rows
        is_rec += [kind == "recovery"] * len(rows)
        kept.append((kind, recs))
    if not seqs:
        return None, kept, dropped
    batch = pad_sequences(seqs, length)
    batch["is_recovery"] = np.asarray(is_rec, bool)
    return batch, kept, dropped


def build_grpo(stage_config, fns):
    """The compiled GRPO step and its optimizer for `stage_config` (built once, shared by the
    plain and ReTerm arms: same shapes, one compilation)."""
    from tr.train import steps as steps_lib

    train_cfg = steps_lib.default_config()
    opt = train_cfg.actor.optimizer
    opt.learning_rate = stage_config.learning_rate
    train_cfg.grpo.group_size = stage_config.group_size
    train_cfg.grpo.eps_low = stage_config.eps_low        # not given by the paper: a config value
    train_cfg.grpo.eps_high = stage_config.eps_high
    train_cfg.grpo.std_eps = stage_config.std_eps
    train_cfg.grpo.group_weighting = stage_config.group_weighting
    step = steps_lib.build_steps(train_cfg, actor_logprobs=fns.actor_logprobs).grpo
    return step, steps_lib.make_optimizer(opt)


def run_grpo(stage_config, run_dir, *, params, fns, actor, tasks, config, queue=None,
             stage_name: str | None = None, built=None) -> tuple:
    """Stage kind `reterm_grpo` (``queue`` given: M_O original + M_R recovery groups) or plain
    `grpo` (no queue: M_O + M_R original groups, compute-matched).  Returns (params, summary)."""
    import jax

    from tr.agent.recovery import CONDENSED_PROMPT, failure_of_group
    from tr.agent.rollout import discard_snapshot_ref, group_specs, recovery_specs, run_rollouts
    from tr.agent.transcript import ChatLayout
    from tr.train.state import create_train_state

    t0 = time.monotonic()
    g = stage_config.group_size
    grpo, optimizer = built if built is not None else build_grpo(stage_config, fns)
    state = create_train_state(actor_params=params, actor_optimizer=optimizer,
                               seed=stage_config.seed)
    layout = ChatLayout(actor.tokenizer)
    rng = random.Random(stage_config.seed)
    by_id = {t.id: t for t in tasks}
    order = list(tasks)
    cursor, curve = 0, []
    name = "reterm_grpo" if queue is not None else "grpo"
    for it in range(stage_config.updates):
        actor.set_params(state.actor_params)
        policy = actor.policy(temperature=1.0, top_p=1.0, seed=stage_config.seed * 7919 + it,
                              name=name)
        rc = _rollout_config(config, policy, snapshot=queue is not None)
        parents = queue.pop(stage_config.m_recovery) if queue is not None else []
        n_orig = stage_config.m_original + stage_config.m_recovery - len(parents)
        picked = []
        for _ in range(n_orig):
            if cursor % len(order) == 0:
                rng.shuffle(order)
            picked.append(order[cursor % len(order)])
            cursor += 1
        specs = group_specs(picked, g, seed=it, prefix=f"{name}{stage_config.seed}")
        for p in parents:
            specs += recovery_specs(by_id[p.task_id], p, g, seed=it, recovery_prompt=CONDENSED_PROMPT)
        out = run_rollouts(specs, policy, layout, rc)
        grouped: dict[str, list] = {}
        for rec in out.records:
            grouped.setdefault(rec.group_id, []).append(rec)
        groups = [("recovery" if recs[0].kind == "recovery" else "original", recs)
                  for _, recs in sorted(grouped.items())]
        keep_refs = set()
        if queue is not None:
            for kind, recs in groups:
                if kind == "original":
                    f = failure_of_group(recs, rng)
                    if f is not None:
                        queue.push(f)
                        keep_refs.add(f.episode_id)
            queue.release(parents)
        for rec in out.records + out.cancelled:
            if rec.episode_id not in keep_refs:
                discard_snapshot_ref(rec.snapshot_ref)
        batch, kept, dropped = group_rows(groups, length=stage_config.length)
        metrics = {}
        if batch is not None:
            state, m = grpo(state, batch)
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}

        def mean_pass(kind):
            xs = [bool(r.passed) for k, recs in groups if k == kind for r in recs
                  if r.status.counts]
            return float(np.mean(xs)) if xs else None

        curve.append({"update": it + 1, "original_reward": mean_pass("original"),
                      "recovery_reward": mean_pass("recovery"), "recovery_groups": len(parents),
                      "dropped_groups": dropped, "queue": len(queue) if queue is not None else 0,
                      **metrics})
    summary = {"kind": name, "updates": stage_config.updates, "group_size": g,
               "m_original": stage_config.m_original, "m_recovery": stage_config.m_recovery,
               "group_weighting": stage_config.group_weighting,
               "wall_s": time.monotonic() - t0}
    if queue is not None:
        summary["queue"] = queue.stats()
    _write_stage(run_dir, stage_name or name, summary, curve)
    return state.actor_params, summary, curve


# ----------------------------------------------------------------------------------------------
# Evaluation of one arm.

def evaluate_arm(actor, params, name, config, test_tasks, heldout, by_id, workdir) -> dict:
    from tr.agent.recovery import episode_costs, recovery_at_k
    from tr.agent.records import write_shard
    from tr.agent.rollout import group_specs, run_rollouts
    from tr.agent.transcript import ChatLayout

    actor.set_params(params)
    ev = config.eval
    policy = actor.policy(temperature=ev.temperature, top_p=ev.top_p, seed=config.seed, name=name)
    rc = _rollout_config(config, policy)
    layout = ChatLayout(actor.tokenizer)
    out = run_rollouts(group_specs(test_tasks, 1, seed=config.seed, prefix=f"eval-{name}"),
                       policy, layout, rc)
    counted = [r for r in out.records if r.status.counts]
    d = pathlib.Path(workdir) / "episodes"
    d.mkdir(parents=True, exist_ok=True)
    write_shard(out.records, d / f"test-{name}.jsonl")
    rec = recovery_at_k(policy, heldout, by_id, ev.k, layout, rc, seed=config.seed)
    return {"pass_at_1": float(np.mean([bool(r.passed) for r in counted])) if counted else 0.0,
            "episodes": len(counted), "recovery_at_k": rec["recovery_at_k"], "k": ev.k,
            **episode_costs(out.records),
            "recovery": {"by_category": rec["by_category"], "mean_turns": rec["mean_turns"],
                         "mean_tokens": rec["mean_tokens"], "states": rec["states"]}}


# ----------------------------------------------------------------------------------------------
# The job.

def _check(config) -> None:
    for path in ("data.attempts", "data.train_tasks", "grpo.group_size", "grpo.updates",
                 "grpo.m_original", "queue.capacity", "eval.k", "eval.test_count", "sft.steps"):
        section, field = path.split(".")
        if int(config[section][field]) < 1:
            raise ConfigError(f"config.{path} must be >= 1, got {config[section][field]}")
    if config.grpo.m_recovery < 0:
        raise ConfigError(f"config.grpo.m_recovery must be >= 0, got {config.grpo.m_recovery}")
    if config.grpo.group_weighting not in ("equal", "literal"):
        raise ConfigError(f"config.grpo.group_weighting = {config.grpo.group_weighting!r}: "
                          "expected 'equal' or 'literal'")
    if config.queue.sampling not in ("front", "uniform"):
        raise ConfigError(f"config.queue.sampling = {config.queue.sampling!r}: expected 'front' "
                          "or 'uniform'")
    for i, entry in enumerate(config.queue.get("sweep", ())):
        if (len(entry) != 2 or int(entry[0]) < 1 or entry[1] not in ("front", "uniform")):
            raise ConfigError(f"config.queue.sweep[{i}] = {tuple(entry)!r}: expected (capacity >= 1, "
                              "'front' | 'uniform')")
    if config.teacher.kind not in ("embedded", "http"):
        raise ConfigError(f"config.teacher.kind = {config.teacher.kind!r}: expected 'embedded' "
                          "or 'http'")


def _say(text: str) -> None:
    print(f"[reterm] {text}", flush=True)


def run(config, workdir):
    import ml_collections
    from flax import nnx

    from tr.agent import recovery
    from tr.agent.transcript import ChatLayout
    from tr.envs import gym
    from tr.models.decoder import Decoder
    from tr.stages import base as base_lib
    from tr.train import steps as steps_lib

    _check(config)
    if config.variant == "paper":
        return validate_paper(config, workdir)
    t_start = time.monotonic()
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = embedded.load_tokenizer(config.tokenizer)
    layout = ChatLayout(tokenizer)
    model = Decoder(embedded.model_config(config.model), rngs=nnx.Rngs(config.seed))
    fns = steps_lib.nnx_model_fns(model)
    actor = Actor(model, tokenizer, concurrency=config.concurrency,
                  prompt_bucket=config.eval.prompt_bucket)
    timings = {}

    # Base: SFT on the scripted teacher's demos (tr.stages.base), a fixed number of steps.
    t0 = time.monotonic()
    demo_cfg = ml_collections.ConfigDict({"seed": config.seed, "concurrency": config.concurrency,
                                          "demos": dict(config.base.demos),
                                          "sft": {"length": config.sft.length}})
    demos, demo_stats = base_lib.make_demos(demo_cfg, tokenizer, layout)
    params, _ = sft_train(fns.actor_params, demos, fns=fns, steps=config.base.steps,
                          batch=config.base.batch, length=config.sft.length,
                          lr=config.base.learning_rate, seed=config.seed, pad_id=tokenizer.pad_id)
    arms_params = {"base": params}
    timings["base_s"] = time.monotonic() - t0
    _say(f"base: {len(demos)} demo sequences, {config.base.steps} SFT steps, "
         f"{timings['base_s']:.0f}s")

    # ReTerm data: the Base's own failures on train, the teacher's recoveries, four filters.
    t0 = time.monotonic()
    train_tasks = gym.split_tasks("train", config.data.train_tasks, seed=config.seed)
    test_tasks = gym.split_tasks("test", config.eval.test_count, seed=config.seed)
    by_id = {t.id: t for t in train_tasks + test_tasks}
    actor.set_params(params)
    base_policy = actor.policy(temperature=1.0, top_p=1.0, seed=config.seed, name="base")
    rc_cfg = _rollout_config(config, base_policy, snapshot=True)
    failures, fail_stats = recovery.collect_failures(base_policy, train_tasks, config.data.attempts,
                                                     layout, rc_cfg, seed=config.seed)
    if config.teacher.kind == "embedded":
        teacher = recovery.EmbeddedTeacher(train_tasks)
    else:
        teacher = recovery.make_teacher("http", base_url=config.teacher.base_url,
                                        model=config.teacher.model)
    from tr.agent.harness import Budgets
    teacher_cfg = dataclasses.replace(rc_cfg, budgets=Budgets(
        max_turns=config.teacher.max_turns, max_output_tokens=config.teacher.max_output_tokens,
        max_context_tokens=config.teacher.max_context_tokens))
    recs = recovery.teacher_recoveries(teacher, failures, by_id, layout, teacher_cfg,
                                       seed=config.seed)
    recovery.discard_failures(failures)
    rows, dataset = recovery.build_dataset(failures, recs, by_id, layout)
    shards = recovery.write_shards(rows, workdir / "reterm-data")
    dataset["shards"] = len(shards)
    dataset["collection"] = fail_stats
    timings["data_s"] = time.monotonic() - t0
    _say(f"data: {json.dumps({k: dataset[k] for k in ('failures', 'kept', 'rejected_by')})}, "
         f"{timings['data_s']:.0f}s")

    # Held-out failure states: collected once from the Base on test, fixed for every arm.
    heldout, held_stats = recovery.collect_failures(
        actor.policy(temperature=config.eval.temperature, top_p=config.eval.top_p,
                     seed=config.seed + 1, name="base"),
        test_tasks, 1, layout, rc_cfg, seed=config.seed + 1, prefix="heldout")
    recovery.discard_failures(heldout[config.eval.heldout_states:])   # only the first N are kept
    heldout = heldout[:config.eval.heldout_states]
    try:
        t0 = time.monotonic()
        sft_cfg = ml_collections.ConfigDict({**config.sft.to_dict(), "seed": config.seed,
                                             "data": str(workdir / "reterm-data")})
        if rows:
            arms_params["sft"], sft_summary = run_sft(sft_cfg, workdir, params=params, fns=fns,
                                                      tokenizer=tokenizer)
        else:
            arms_params["sft"], sft_summary = params, {"kind": "reterm_sft", "rows": 0}
        timings["sft_s"] = time.monotonic() - t0
        _say(f"reterm_sft: {sft_summary}")

        g_cfg = ml_collections.ConfigDict({**config.grpo.to_dict(), "seed": config.seed,
                                           "length": config.sft.length})
        t0 = time.monotonic()
        built = build_grpo(g_cfg, fns)
        arms_params["grpo"], grpo_summary, grpo_curve = run_grpo(
            g_cfg, workdir, params=arms_params["sft"], fns=fns, actor=actor, tasks=train_tasks,
            config=config, built=built)
        timings["grpo_s"] = time.monotonic() - t0
        _say(f"grpo: {grpo_curve}")
        t0 = time.monotonic()
        queue = recovery.RecoveryQueue(config.queue.capacity, sampling=config.queue.sampling,
                                       seed=config.seed)
        try:
            arms_params["reterm_grpo"], reterm_summary, reterm_curve = run_grpo(
                g_cfg, workdir, params=arms_params["sft"], fns=fns, actor=actor,
                tasks=train_tasks, config=config, queue=queue, built=built)
        finally:
            queue.close()
        timings["reterm_grpo_s"] = time.monotonic() - t0
        _say(f"reterm_grpo: {reterm_curve}")

        t0 = time.monotonic()
        arms = {a: evaluate_arm(actor, arms_params[a], a, config, test_tasks, heldout, by_id,
                                workdir) for a in ARMS}
        timings["eval_s"] = time.monotonic() - t0

        sweep = []
        for capacity, sampling in (config.queue.sweep if config.variant == "queue" else ()):
            # beyond the paper: ReTerm-GRPO from the same SFT actor per (K, sampling)
            t0 = time.monotonic()
            q = recovery.RecoveryQueue(capacity, sampling=sampling, seed=config.seed)
            try:
                p, summ, curve = run_grpo(g_cfg, workdir, params=arms_params["sft"], fns=fns,
                                          actor=actor, tasks=train_tasks, config=config, queue=q,
                                          stage_name=f"reterm_grpo-K{capacity}-{sampling}",
                                          built=built)
            finally:
                q.close()
            ev = evaluate_arm(actor, p, f"reterm_grpo-K{capacity}-{sampling}", config,
                              test_tasks, heldout, by_id, workdir)
            sweep.append({"capacity": capacity, "sampling": sampling,
                          "pass_at_1": ev["pass_at_1"], "recovery_at_k": ev["recovery_at_k"],
                          "mean_turns": ev["mean_turns"], "queue": summ["queue"],
                          "wall_s": time.monotonic() - t0})
            _say(f"queue sweep: {sweep[-1]}")
    finally:
        recovery.discard_failures(heldout)

    report = {"experiment": "reterm", "variant": config.variant, "seed": config.seed,
              "wall_s": time.monotonic() - t_start, "arms": arms,
              "dataset": {k: dataset[k] for k in ("failures", "recoveries", "kept", "rejected_by",
                                                  "flagged", "shards", "collection")},
              "queue": {"capacity": config.queue.capacity, "sampling": config.queue.sampling,
                        "inserted": reterm_summary["queue"]["inserted"],
                        "evicted": reterm_summary["queue"]["evicted"],
                        "sampled": reterm_summary["queue"]["sampled"]},
              "heldout": {"states": len(heldout), **held_stats},
              "queue_sweep": sweep,
              "curves": {"grpo": grpo_curve, "reterm_grpo": reterm_curve},
              "stages": {"reterm_sft": sft_summary, "grpo": grpo_summary,
                         "reterm_grpo": reterm_summary},
              "demos": demo_stats, "timings": timings,
              "config": {"group_weighting": config.grpo.group_weighting,
                         "eps_low": config.grpo.eps_low, "eps_high": config.grpo.eps_high,
                         "teacher": config.teacher.kind}}
    (workdir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    (workdir / "report.md").write_text(report_md(report))
    plot_curves(report, workdir / "reward_curves.png")
    print(report_md(report), flush=True)
    return report


def report_md(report: dict) -> str:
    lines = [f"# ReTerm ({report['variant']}, seed {report['seed']}, wall {report['wall_s']:.0f} s)",
             "", "| arm | Pass@1 (test) | episodes | Recovery@k | k | mean turns | mean tokens |",
             "|---|---|---|---|---|---|---|"]
    for a, v in report["arms"].items():
        lines.append(f"| {a} | {v['pass_at_1']:.3f} | {v['episodes']} | {v['recovery_at_k']:.3f} "
                     f"| {v['k']} | {v['mean_turns']:.2f} | {v['mean_tokens']:.1f} |")
    d = report["dataset"]
    lines += ["", f"Dataset: {d['failures']} failures, {d['recoveries']} teacher recoveries, "
              f"{d['kept']} kept; rejected by " + ", ".join(f"{k} {v}" for k, v in
                                                           d["rejected_by"].items()) + ".",
              f"Queue: capacity {report['queue']['capacity']} ({report['queue']['sampling']}), "
              f"{report['queue']['inserted']} inserted, {report['queue']['evicted']} evicted.",
              "", "Recovery rate by rule-based error category of the held-out failure:", "",
              "| arm | " + " | ".join(
                  sorted({c for v in report["arms"].values() for c in v["recovery"]["by_category"]}))
              + " |"]
    cats = sorted({c for v in report["arms"].values() for c in v["recovery"]["by_category"]})
    lines.append("|---" * (len(cats) + 1) + "|")
    for a, v in report["arms"].items():
        bc = v["recovery"]["by_category"]
        lines.append(f"| {a} | " + " | ".join(
            f"{bc[c]['recovered']}/{bc[c]['states']}" if c in bc else "-" for c in cats) + " |")
    if report.get("queue_sweep"):
        lines += ["", "Queue sweep (ReTerm-GRPO from the same SFT actor):", "",
                  "| K | sampling | Pass@1 | Recovery@k | inserted | evicted |", "|---|---|---|---|---|---|"]
        for e in report["queue_sweep"]:
            lines.append(f"| {e['capacity']} | {e['sampling']} | {e['pass_at_1']:.3f} | "
                         f"{e['recovery_at_k']:.3f} | {e['queue']['inserted']} | "
                         f"{e['queue']['evicted']} |")
    return "\n".join(lines) + "\n"


def plot_curves(report: dict, path) -> None:
    """Figure 6's analogue: mean reward of original and recovery groups per update."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, curve in report["curves"].items():
        for key, style in (("original_reward", "-"), ("recovery_reward", "--")):
            xs = [c["update"] for c in curve if c[key] is not None]
            ys = [c[key] for c in curve if c[key] is not None]
            if xs:
                ax.plot(xs, ys, style, marker="o", label=f"{arm} {key.split('_')[0]}")
    ax.set_xlabel("update")
    ax.set_ylabel("mean strict pass")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def validate_paper(config, workdir) -> dict:
    """The `paper` variant loads and validates only: the named model exists and the batch is
    (M_O + M_R) x G."""
    from tr.models.config import get_model_config

    model = get_model_config(config.model)
    rows = (config.grpo.m_original + config.grpo.m_recovery) * config.grpo.group_size
    if rows != config.grpo.batch:
        raise ConfigError(f"config.grpo.batch = {config.grpo.batch} != (m_original + m_recovery) "
                          f"x group_size = {rows}")
    out = {"experiment": "reterm", "variant": "paper", "validated": True,
           "model": config.model, "params_d_model": model.d_model, "grpo_batch": rows}
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(workdir) / "report.json").write_text(json.dumps(out, indent=2))
    return out
