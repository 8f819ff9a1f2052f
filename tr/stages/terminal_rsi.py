"""The `terminal_rsi` job (issue 14): the stage schedule of `experiments/terminal_rsi.py`, then a
`test` evaluation of every stage's retained actor and the report.

    stages    config.stages over config.stage_defaults, run as the `pipeline` job runs them (a
              finished stage is not re-run, a killed one resumes); `config.seed` is every stage's
              seed; `config.ablation.cell` rewrites the schedule into one arm of the ablation
    evaluate  each report row's stage (config.report.stages: row -> stage), its retained actor
              (summary.json `retained_step`, chosen on `val`) on the gym's `test` split: Mean@k
              = (1/|T|) Σ_x (1/k) Σ_r S(x, r) and Pass@1, by family and tier (cached per stage in
              report-evals/<stage>/eval.json; a stage whose retained actor has the hash of one
              already evaluated, e.g. it kept its step 0, reuses that evaluation)
    critic    EV = 1 − Var(R − V)/Var(R) per update, from the metrics of warmup, rpr1, rpr2
    rescore   FDR vs SPR on the run's own RPR trajectories (same outcomes, only the formula
              changes; tr.rewards.rescore), with RPR-1's frozen scale table
    write     report.json (the issue's keys + more), report.md, plots/*.png

`python -m tr.stages.terminal_rsi merge RUN_DIR... --out DIR` merges the report.json of ablation
runs (one per arm and seed) into ablation.json, ablation.md and ablation.png (mean ± std over seeds
of each arm's test Mean@k per stage).  `python -m tr.stages.terminal_rsi cells --seed S --root DIR
[--cells ...]` runs arms of one seed one after another in DIR/seed-S/<arm>, each starting from the
stage folders it shares with an arm of that seed already run (`shared_stages`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Sequence

from tr.envs import gym
from tr.models import embedded
from tr.models.config import get_model_config
from tr.rewards import profile, rescore
from tr.rewards.rescore import format_metrics, plot_rewards
from tr.stages import checkpoints, pipeline, progress
from tr.stages import evaluate as evaluate_job
from tr.stages.machine import machine_info
from tr.stages.registry import STAGE_KINDS, ConfigError, stage_kind
from tr.stages.stage_config import resolve_stage_config
from tr.train.checkpoint import tree_hash
from tr.train.compile import CompileClock, use_compilation_cache

REPORT_ROWS = ("base", "rsr1", "rpr1", "rsr2", "rpr2")
EV_STAGES = ("warmup", "rpr1", "rpr2")
FACTORS = {"estimator": ("tb_gae", "token_gae"), "rewards": ("fdr_spr", "fdr"),
           "critic": ("inherit", "reset")}
CELLS = tuple(f"{e}/{r}/{c}" for e in FACTORS["estimator"] for r in FACTORS["rewards"]
              for c in FACTORS["critic"])
ARMS = CELLS + ("direct_ppo", "rsr_only")          # the factorial's cells and its two extra arms
# λ of both clocks in the factorial's cells (TB-GAE's λ_turn, token GAE's λ; γ stays 1).  At
# γ = λ = 1 the two estimators are one function (SPEC §2, the unit-clock equivalence): measured,
# the token_gae/fdr_spr/inherit arm at λ = 1 reproduced tb_gae/fdr_spr/inherit to the last digit
# of every EV and test score (3 Dec), so the estimator factor needs λ < 1 to compare anything.
FACTORIAL_LAM = 0.95


# ------------------------------------------------------------------------------------------------
# The schedule


def _plain(tree):
    return tree.to_dict() if hasattr(tree, "to_dict") else copy.deepcopy(tree)


def arm_stages(entries: list[dict], report: dict, cell: str,
               lam: float = FACTORIAL_LAM) -> tuple[list[dict], dict, dict]:
    """The schedule and report rows of ablation arm `cell` (pure; '' = unchanged).

    `E/R/C`: estimator E for every stage, with λ = `lam` on its clock (TB-GAE's λ_turn, token
    GAE's λ); R = `fdr` keeps FDR in RPR-2 (else SPR); C = `reset`
    gives RPR-1 and RPR-2 a fresh critic (the warm-up still runs: same rollouts and updates).
    `direct_ppo`: Base then one RPR stage with a fresh critic and FDR, with the calibration and
    PPO iterations of RPR-1 + RPR-2. `rsr_only`: Base, RSR-1, RSR-2 (actor from RSR-1).
    Returns (entries, report rows, shared-config overrides).
    """
    by_name = {e["name"]: copy.deepcopy(e) for e in entries}
    shared: dict = {}
    if not cell:
        return [by_name[e["name"]] for e in entries], dict(report), shared
    if cell == "direct_ppo":
        iters = sum(by_name[s].get("rpr", {}).get("iterations", 0) for s in ("rpr1", "rpr2"))
        calib = sum(by_name[s].get("rpr", {}).get("calibration_updates", 0)
                    for s in ("rpr1", "rpr2"))
        ppo = {"name": "ppo", "kind": "rpr", "actor_from": "base", "critic_from": "fresh",
               "rpr": {"reward": "fdr", "calibration_updates": calib, "iterations": iters}}
        return [by_name["base"], ppo], {"base": "base", "rpr2": "ppo"}, shared
    if cell == "rsr_only":
        rsr2 = {**by_name["rsr2"], "actor_from": "rsr1"}
        return ([by_name["base"], by_name["rsr1"], rsr2],
                {"base": "base", "rsr1": "rsr1", "rsr2": "rsr2"}, shared)
    parts = cell.split("/")
    if len(parts) != 3 or any(p not in FACTORS[f] for p, f in zip(parts, FACTORS)):
        raise ConfigError(f"config.ablation.cell = {cell!r}: expected 'direct_ppo', 'rsr_only' or "
                          f"estimator/rewards/critic with estimator in {FACTORS['estimator']}, "
                          f"rewards in {FACTORS['rewards']}, critic in {FACTORS['critic']}")
    estimator, rewards, critic = parts
    shared = {"train": {"ppo": {"estimator": estimator, "lam_turn": float(lam), "lam": float(lam)}}}
    if rewards == "fdr":
        by_name["rpr2"].setdefault("rpr", {})["reward"] = "fdr"
    if critic == "reset":
        by_name["rpr1"]["critic_from"] = "fresh"
        by_name["rpr2"]["critic_from"] = "fresh"
    return [by_name[e["name"]] for e in entries], dict(report), shared


_merge = pipeline.merge_entry   # the pipeline job's own rule for an entry over stage_defaults


def rsr_overlay(entry: dict, rsr: dict) -> dict:
    """`entry` with the experiment-wide RSR settings `rsr` (config.rsr) laid on it when it is an
    RSR stage (pure): every field but `learning_rate` goes to its `rsr` section, `learning_rate`
    (0 = the kind's default) to `train.actor.optimizer.learning_rate`.  So both RSR stages take
    `--config.rsr.FIELD=...` from the command line."""
    if entry.get("kind") != "rsr" or not rsr:
        return entry
    section = {k: v for k, v in rsr.items() if k != "learning_rate"}
    out = _merge(entry, {"rsr": section})
    if float(rsr.get("learning_rate", 0.0)):
        out = _merge(out, {"train": {"actor": {"optimizer": {
            "learning_rate": float(rsr["learning_rate"])}}}})
    return out


def schedule(config) -> tuple[list[dict], dict, dict, list[dict]]:
    """(entries, shared stage defaults, report rows, skipped stages) the run will use.

    The run's seed goes into every stage; the ablation cell rewrites the schedule; a stage of a
    kind this checkout lacks is an error, or (`missing_kinds = 'skip'`) left out with its
    children's `actor_from` / `critic_from` pointing at its own parents.
    """
    rsr = _plain(config.get("rsr", {})) or {}
    entries = [rsr_overlay(_plain(e), rsr) for e in config.stages]
    report = dict(_plain(config.report.stages))
    cell = str(config.get("ablation", {}).get("cell", "") or "")
    lam = float(config.get("ablation", {}).get("lam", FACTORIAL_LAM))
    entries, report, shared_over = arm_stages(entries, report, cell, lam)
    shared = _merge(_plain(config.stage_defaults), shared_over)
    ppo = shared.get("train", {}).get("ppo", {})
    if cell in CELLS and lam == 1.0 and ppo.get("gamma_turn", 1.0) == ppo.get("gamma", 1.0) == 1.0:
        raise ConfigError(f"config.ablation.lam = {lam}: with γ = λ = 1 TB-GAE and token GAE are "
                          "the same estimator (SPEC §2, unit-clock equivalence), so arm "
                          f"{cell!r} would compare a function with itself; set λ < 1 "
                          f"(default {FACTORIAL_LAM})")
    shared["seed"] = int(config.seed)
    for entry in entries:
        entry.pop("seed", None)
    missing = [e for e in entries if e["kind"] not in STAGE_KINDS]
    skipped = []
    if missing and config.missing_kinds != "skip":
        raise ConfigError(
            f"stage kind(s) {sorted({e['kind'] for e in missing})} of stages "
            f"{[e['name'] for e in missing]} are not built in this checkout (known: "
            f"{sorted(STAGE_KINDS)}); set --config.missing_kinds=skip to run without them")
    for gone in missing:
        entries = [e for e in entries if e is not gone]
        for entry in entries:
            for side in ("actor_from", "critic_from"):
                if entry.get(side) == gone["name"]:
                    entry[side] = gone.get(side) or gone.get("actor_from", "")
        report = {row: stage for row, stage in report.items() if stage != gone["name"]}
        skipped.append({"name": gone["name"], "kind": gone["kind"],
                        "why": f"stage kind {gone['kind']!r} is not built in this checkout"})
    return entries, shared, report, skipped


def validate(config) -> dict:
    """Resolves every stage's config against its kind's defaults (unknown field -> ConfigError)
    and checks the parents, the report rows and the sizes, without building anything."""
    entries, shared, report, skipped = schedule(config)
    names = []
    for index, entry in enumerate(entries):
        for parent in ("actor_from", "critic_from"):
            source = entry.get(parent)
            if source and source != "fresh" and source not in names:
                raise ConfigError(f"stage {entry['name']!r}: {parent}={source!r} is not an earlier "
                                  f"stage (earlier: {names})")
        names.append(entry["name"])
        _check_stage(entry["kind"], _merge(shared, entry))
    unknown = sorted(set(report) - set(REPORT_ROWS))
    if unknown:
        raise ConfigError(f"config.report.stages has unknown row(s) {unknown}; rows: {REPORT_ROWS}")
    absent = sorted(s for s in report.values() if s not in names)
    if absent:
        raise ConfigError(f"config.report.stages names stage(s) {absent} not in the schedule {names}")
    if int(config.report.k) < 1:
        raise ConfigError(f"config.report.k = {config.report.k}: must be >= 1")
    model = dict(shared.get("model", {}))
    if not model.get("name"):     # inherited from Base's manifest: the embedded model
        model = {"name": embedded.MODEL, "overrides": {}}
    try:
        model_config = get_model_config(model["name"], **dict(model.get("overrides", {})))
    except ValueError as error:
        raise ConfigError(f"config.stage_defaults.model: {error}") from None
    return {"stages": [{k: e[k] for k in ("name", "kind") if k in e} |
                       {k: e.get(k, "") for k in ("actor_from", "critic_from")} for e in entries],
            "report": report, "skipped": skipped,
            "model": {"name": model.get("name"), "params_millions": _params_m(model_config)}}


def _check_stage(kind: str, merged: dict) -> None:
    """The stage kind's own config resolution (unknown field -> ConfigError) and, for `rsr` and
    `rpr`, its value checks (a bad value -> ConfigError naming the field); nothing built."""
    import importlib  # pylint: disable=g-import-not-at-top

    if kind not in STAGE_KINDS or kind == "init":
        return
    module = importlib.import_module(STAGE_KINDS[kind].split(":")[0])
    if kind == "base":
        module.stage_config(merged)
    elif hasattr(module, "defaults"):
        resolved = resolve_stage_config(merged, module.defaults())
        if kind in ("rsr", "rpr"):      # its value checks too, before anything runs
            module.check_config(resolved)


def _params_m(cfg) -> float:
    d, f, n = cfg.d_model, cfg.d_ff, cfg.n_layers
    attn = d * cfg.head_dim * (cfg.n_heads * 2 + cfg.n_kv_heads * 2)
    return round((n * (attn + 3 * d * f) + 2 * cfg.vocab_size * d) / 1e6, 1)


# ------------------------------------------------------------------------------------------------
# Running the stages


def run_stages(entries, shared, run_dir: pathlib.Path) -> dict:
    """The pipeline over `entries` (a finished stage returns its summary at once); wall time per
    stage in `stage_times.json`."""

    times_path, compile_path = run_dir / "stage_times.json", run_dir / "stage_compile_s.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    compiles = json.loads(compile_path.read_text()) if compile_path.exists() else {}
    summaries = {}
    for i, entry in enumerate(entries):
        merged = _merge(shared, entry)
        t0, clock = time.monotonic(), CompileClock()
        with progress.stage(i, len(entries), entry["name"], entry["kind"]):
            summaries[entry["name"]] = stage_kind(entry["kind"])(merged, run_dir)
        times.setdefault(entry["name"], round(time.monotonic() - t0, 1))
        compiles.setdefault(entry["name"], clock.read())
        times_path.write_text(json.dumps(times, indent=1))
        compile_path.write_text(json.dumps(compiles, indent=1))
        (run_dir / "pipeline.json").write_text(
            json.dumps(summaries, indent=1, sort_keys=True, default=str))
    return summaries


# ------------------------------------------------------------------------------------------------
# Test evaluation of a stage's retained actor


def retained_step(run_dir: pathlib.Path, stage: str) -> int:
    summary = json.loads((run_dir / stage / "summary.json").read_text())
    step = summary.get("retained_step")
    return int(summary["finished_step"] if step is None else step)


def restore_actor(run_dir: pathlib.Path, stage: str, step: int):
    """(Decoder with `stage`'s actor at `step`, tokenizer, system prompt, its parameter dict),
    through the one checkpoint loader (`tr.stages.checkpoints`)."""
    loaded = checkpoints.load_stage(run_dir, stage, step)
    return loaded.model, loaded.tokenizer, loaded.system_prompt, loaded.params


def retained_actor_hash(run_dir: pathlib.Path, stage: str) -> str | None:
    """`tree_hash` of the actor a stage retained (the one its report row evaluates): the summary's
    final `actor_hash` when it retained its last step, else that of the checkpoint restored."""
    summary = json.loads((run_dir / stage / "summary.json").read_text())
    step = retained_step(run_dir, stage)
    if step == summary.get("finished_step", step):
        return summary.get("actor_hash")

    return tree_hash(restore_actor(run_dir, stage, step)[3])


def evaluate_stage(run_dir: pathlib.Path, stage: str, report_config, tasks, *, seed: int,
                   same_actor: dict | None = None) -> dict:
    """Mean@k / Pass@1 of `stage`'s retained actor on `tasks` (evaluation sampling); cached.

    `same_actor`: the evaluation of another stage of this run whose retained actor has the same
    hash (a stage that kept its step 0). The evaluation is a function of the parameters, the tasks
    and the seed (batch-invariant sampler), so it is reused, not re-run (`same_actor_as` says so).
    """
    out_dir = run_dir / f"report-evals{split_suffix(report_config.split)}" / stage
    step = retained_step(run_dir, stage)
    settings = evaluation_settings(report_config, tasks, seed)
    cached = out_dir / "eval.json"
    if cached.exists():
        data = json.loads(cached.read_text())
        if data.get("retained_step") == step and data.get("settings") == settings:
            return data
    if same_actor is not None:
        data = {**same_actor, "stage": stage, "retained_step": step, "eval_s": 0.0,
                "same_actor_as": same_actor.get("same_actor_as", same_actor["stage"])}
        out_dir.mkdir(parents=True, exist_ok=True)
        _write(cached, json.dumps(data, indent=1, sort_keys=True, default=str))
        return data
    loaded = checkpoints.load_stage(run_dir, stage, step)
    t0 = time.monotonic()
    summary = evaluate_job.evaluate_loaded(loaded, tasks, report_config, workdir=out_dir, seed=seed,
                                           name=stage)
    data = {"stage": stage, "retained_step": step, "eval_s": time.monotonic() - t0,
            "settings": settings, **summary}
    _write(cached, json.dumps(data, indent=1, sort_keys=True, default=str))
    return data


def split_suffix(split: str) -> str:
    """The file-name suffix of a report on `split`: none for `test` (report.json, plots/,
    report-evals/), `-val` for `val` (report-val.json, plots-val/, report-evals-val/), so a
    report on another split never overwrites the test report or reuses its evaluations."""
    return "" if split == "test" else f"-{split}"


def evaluation_settings(report_config, tasks, seed: int) -> dict:
    """What a cached evaluation must match to be reused: the tasks, k, sampling and budgets."""
    rc = report_config
    return {"split": str(rc.split), "tasks": [t.id for t in tasks], "k": int(rc.k),
            "temperature": float(rc.temperature), "top_p": float(rc.top_p),
            "max_turns": int(rc.max_turns), "max_output_tokens": int(rc.max_output_tokens),
            "context": int(rc.get("context", 0)), "seed": int(seed)}


def stage_row(row: str, data: dict, split: str) -> dict:
    k = data["k"]

    def mean(group):
        value = group.get(f"mean@{k}")
        return None if value is None else float(value)
    return {"name": row, "stage": data["stage"], "retained_step": data["retained_step"],
            "split": split, "k": k, "episodes": data["episodes"],
            "mean_at_k": mean(data["overall"]) or 0.0,
            "pass_at_1": float(data["overall"]["pass@1"] or 0.0),
            "by_family": {f: mean(v) for f, v in data["by_family"].items()},
            "by_tier": {t: mean(v) for t, v in data["by_tier"].items()},
            "pass_at_1_by_family": {f: v["pass@1"] for f, v in data["by_family"].items()},
            "infra_failures": data.get("infra_failures", 0), "eval_s": data.get("eval_s"),
            **({"same_actor_as": data["same_actor_as"]} if data.get("same_actor_as") else {})}


# ------------------------------------------------------------------------------------------------
# Critic EV, rescoring


def read_jsonl(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def ev_curve(run_dir: pathlib.Path, stages: dict) -> list[dict]:
    """[{stage, update, ev, phase}] from the metrics of the warm-up and RPR stages; `ev` is None
    where it is undefined (returns of zero variance: every reward equal, e.g. no success)."""
    out = []
    for row, stage in stages.items():
        for line in read_jsonl(run_dir / stage / "metrics.jsonl"):
            if "critic/explained_variance" not in line:
                continue
            ev = line["critic/explained_variance"]
            ev = float(ev) if ev is not None and math.isfinite(ev) else None
            out.append({"stage": row, "update": int(line["step"]), "ev": ev,
                        "phase": line.get("phase")})
    return out


def training_curves(run_dir: pathlib.Path, stages: Sequence[str]) -> dict:
    """Per stage: per-iteration rollout pass rate / reward, and the val evaluations."""
    out = {}
    for stage in stages:
        lines = read_jsonl(run_dir / stage / "metrics.jsonl")
        seen, its = set(), []
        for line in lines:
            if line["iteration"] in seen:
                continue
            seen.add(line["iteration"])
            r = line.get("rollouts", {})
            its.append({"iteration": line["iteration"], "phase": line.get("phase"),
                        "pass_rate": r.get("pass_rate"), "reward_mean": r.get("reward_mean"),
                        "actor_loss": line.get("actor/loss"),
                        "critic_loss": line.get("critic/loss")})
        val = read_jsonl(run_dir / stage / "eval-val.jsonl")
        if its or val:
            out[stage] = {"iterations": its, "val": val}
    return out


def rescore_run(run_dir: pathlib.Path, stages: Sequence[str], scales_stage: str):
    """FDR and SPR of the run's own RPR trajectories (tr.rewards.rescore) under `scales_stage`'s
    frozen table; returns (metrics, rewards, strict_pass, n) or None when there are none."""

    files = [str(p) for s in stages for p in sorted((run_dir / s / "rollouts").glob("*.jsonl"))
             if p.stat().st_size]
    if not files:
        return None
    trajectories, _ = profile.read_trajectories(files, skip_bad=True)
    scales = run_dir / scales_stage / "scales.json"
    table = profile.load_scale_table(scales) if scales.exists() else None
    if table is None or set(trajectories.families) - set(table):
        table = profile.build_scale_table(trajectories)
    metrics, rewards = rescore.rescore(trajectories, table)
    return metrics, rewards, trajectories.strict_pass, len(trajectories.families)


# ------------------------------------------------------------------------------------------------
# The job


def run(config, workdir) -> dict:
    t_start = time.monotonic()
    run_dir = pathlib.Path(workdir)
    info = validate(config)
    if config.get("validate_only", False):
        (run_dir / "validated.json").write_text(json.dumps(info, indent=1, sort_keys=True))
        print(f"[terminal_rsi] {config.variant}: config valid: {json.dumps(info['stages'])}",
              flush=True)
        return info
    entries, shared, report_stages, skipped = schedule(config)
    use_compilation_cache(run_dir / "jax-cache")
    for gone in skipped:
        print(f"[terminal_rsi] skipping stage {gone['name']}: {gone['why']}", flush=True)
    summaries = run_stages(entries, shared, run_dir)

    rc = config.report
    tasks = gym.split_tasks(rc.split, int(rc.count) or None,
                            seed=int(shared.get("tasks", {}).get("seed", 0)))
    rows, by_hash = [], {}
    eval_clock = CompileClock()
    for row in REPORT_ROWS:
        stage = report_stages.get(row)
        if stage is None:
            continue
        # which checkpoint is evaluated: arms are comparable only from the same Base (the same
        # seed trains a different Base on another CPU: XLA CPU code differs per host)
        actor_hash = retained_actor_hash(run_dir, stage)
        data = evaluate_stage(run_dir, stage, rc, tasks, seed=777 + 1000 * int(config.seed),
                              same_actor=by_hash.get(actor_hash) if actor_hash else None)
        if actor_hash:
            by_hash.setdefault(actor_hash, data)
        rows.append(stage_row(row, data, rc.split))
        rows[-1]["actor_hash"] = actor_hash
        same = f" (the actor of {data['same_actor_as']}: not re-run)" if data.get("same_actor_as") else ""
        print(f"[terminal_rsi] {rc.split} {row} ({stage}, step {data['retained_step']}): "
              f"Mean@{rc.k} {rows[-1]['mean_at_k']:.3f}  Pass@1 {rows[-1]['pass_at_1']:.3f}{same}",
              flush=True)
    eval_s = float(sum(row.get("eval_s") or 0.0 for row in rows))   # kept in eval.json across starts
    ev_stages = {"warmup": "warmup"} if "warmup" in summaries else {}
    ev_stages.update({r: report_stages[r] for r in ("rpr1", "rpr2") if r in report_stages})
    times = json.loads((run_dir / "stage_times.json").read_text())
    compile_s = json.loads((run_dir / "stage_compile_s.json").read_text())
    compile_s["test_evaluations"] = eval_clock.read()
    report = {
        "experiment": "terminal_rsi", "variant": str(config.variant), "seed": int(config.seed),
        "wall_s": time.monotonic() - t_start,
        "stages": rows,
        "critic": {"ev": ev_curve(run_dir, ev_stages),
                   "summary": _ev_summary(ev_curve(run_dir, ev_stages))},
        "ablation": _ablation_info(config),
        "skipped": skipped, "stage_wall_s": times, "test_eval_s": eval_s,
        "compile_s": compile_s,
        "test_tasks": len(tasks), "schedule": info["stages"], "machine": machine_info(),
    }
    rpr_stages = [report_stages[r] for r in ("rpr1", "rpr2") if r in report_stages]
    rescored = rescore_run(run_dir, rpr_stages, rpr_stages[0]) if rpr_stages else None
    if rescored is not None:
        report["rescore"] = {"stages": rpr_stages, "trajectories": rescored[3],
                             "metrics": rescored[0]}
    curves = training_curves(run_dir, [e["name"] for e in entries])
    (run_dir / "curves.json").write_text(json.dumps(curves, indent=1, sort_keys=True))
    suffix = split_suffix(rc.split)
    if rc.plots:
        report["plots"] = write_plots(run_dir / f"plots{suffix}", report, curves, rescored)
    # wall_s: every completed start of this run directory (a resumed run adds its time)
    starts_path = run_dir / "starts.json"
    starts = json.loads(starts_path.read_text()) if starts_path.exists() else []
    starts.append(round(time.monotonic() - t_start, 1))
    _write(starts_path, json.dumps(starts))
    report["wall_s"] = float(sum(starts))
    report["starts_wall_s"] = starts
    _write(run_dir / f"report{suffix}.json",
           json.dumps(report, indent=1, sort_keys=True, default=str))
    _write(run_dir / f"report{suffix}.md", report_markdown(report))
    print(stage_table(report), flush=True)
    print(f"[terminal_rsi] wrote {run_dir / f'report{suffix}.json'}, report{suffix}.md, "
          f"plots{suffix}/ (wall {report['wall_s']:.0f}s)", flush=True)
    return report


def _write(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _ablation_info(config) -> dict | None:
    cell = str(config.get("ablation", {}).get("cell", "") or "")
    if not cell:
        return None
    factors = dict(zip(FACTORS, cell.split("/"))) if "/" in cell else {}
    info = {"cell": cell, "factors": factors}
    if factors:
        info["lam"] = float(config.get("ablation", {}).get("lam", FACTORIAL_LAM))
    return info


def arm_label(report: dict) -> str:
    """A report's arm in merged tables: its cell, with `λ=…` for a factorial cell whose λ is not
    1 (reports from before λ was a factor ran at 1 and carry none)."""
    info = report.get("ablation") or {}
    cell = info.get("cell") or report.get("variant", "?")
    lam = info.get("lam", 1.0)
    return cell if "/" not in cell or lam == 1.0 else f"{cell} λ={lam:g}"


def _ev_summary(curve: list[dict]) -> dict:
    out = {}
    for stage in EV_STAGES:
        evs = [p["ev"] for p in curve if p["stage"] == stage and p["ev"] is not None]
        undefined = sum(p["ev"] is None for p in curve if p["stage"] == stage)
        if undefined and not evs:
            out[stage] = {"updates": undefined, "undefined": undefined}
        elif evs:
            out[stage] = {"first": evs[0], "last": evs[-1], "max": max(evs), "min": min(evs),
                          "updates": len(evs) + undefined, "undefined": undefined}
    return out


# ------------------------------------------------------------------------------------------------
# Text


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:5.1f}"


def stage_table(report: dict) -> str:
    rows = report["stages"]
    k = rows[0]["k"] if rows else 3
    tiers = [t for t in ("easy", "medium", "hard", "extreme")
             if any(t in r["by_tier"] for r in rows)]
    head = f"{'stage':<6} {'step':>5} {'Mean@' + str(k):>7} {'Pass@1':>7} " + " ".join(
        f"{t:>8}" for t in tiers)
    lines = [f"Terminal-RSI {report['variant']} seed {report['seed']}: {_split(report)} "
             f"({rows[0]['episodes'] if rows else 0} "
             f"episodes per stage), % success", head]
    for r in rows:
        lines.append(f"{r['name']:<6} {r['retained_step']:>5} {_pct(r['mean_at_k']):>7} "
                     f"{_pct(r['pass_at_1']):>7} " +
                     " ".join(f"{_pct(r['by_tier'].get(t)):>8}" for t in tiers))
    base = next((r for r in rows if r["name"] == "base"), None)
    last = next((r for r in rows if r["name"] == "rpr2"), None)
    if base and last:
        lines.append(f"RPR-2 - Base: {100 * (last['mean_at_k'] - base['mean_at_k']):+.1f} points "
                     f"Mean@{k} (target +15)")
    return "\n".join(lines)


def _split(report: dict) -> str:
    """The split the report's rows were evaluated on (`config.report.split`; `test` by default,
    `val` when a run is used to choose settings)."""
    rows = report["stages"]
    return rows[0].get("split", "test") if rows else "test"


def report_markdown(report: dict) -> str:
    rows = report["stages"]
    k = rows[0]["k"] if rows else 3
    families = sorted({f for r in rows for f in r["by_family"]})
    out = [f"# Terminal-RSI report: `{report['variant']}`, seed {report['seed']}", "",
           f"Wall time {report['wall_s']:.0f} s over {len(report.get('starts_wall_s', [1]))} "
           f"start(s) (stages {json.dumps(report['stage_wall_s'])}, "
           f"{_split(report)} evaluations {report['test_eval_s']:.0f} s); {report['test_tasks']} "
           f"{_split(report)} tasks, "
           f"k = {k}.", ""]
    if report.get("compile_s"):
        spent = {name: round(sum(v.get(f, 0.0) for f in ("trace_s", "lower_s", "backend_s")), 1)
                 for name, v in report["compile_s"].items()}
        out += [f"Compiling (tracing, lowering, XLA; cache misses only) {sum(spent.values()):.0f} s "
                f"of it: {json.dumps(spent)}.", ""]
    if report.get("machine"):
        m = report["machine"]
        out += [f"Machine: {m['cpu']}, {m['cores']} cores, {' '.join(m['isa']) or 'no AVX'}; "
                f"{m['backend']}, jax {m['jax']}.", ""]
    for gone in report.get("skipped", []):
        out.append(f"* **{gone['name']} not run**: {gone['why']}.")
    if report.get("skipped"):
        out.append("")
    if report.get("ablation"):
        out += [f"Ablation arm `{report['ablation']['cell']}`.", ""]
    out += [f"## Success per stage ({_split(report)})", "", "```", stage_table(report), "```", "",
            "By family (Mean@k, %):", "",
            "| stage | " + " | ".join(families) + " |",
            "|---" * (len(families) + 1) + "|"]
    for r in rows:
        out.append(f"| {r['name']} | " + " | ".join(_pct(r["by_family"].get(f)).strip()
                                                    for f in families) + " |")
    out += ["", "## Critic explained variance", ""]
    for stage, s in report["critic"]["summary"].items():
        if "first" not in s:
            out.append(f"* {stage}: {s['updates']} updates, EV undefined throughout (every return "
                       "equal: no success in the batch)")
            continue
        out.append(f"* {stage}: {s['updates']} updates, EV first {s['first']:.3f} -> last "
                   f"{s['last']:.3f} (min {s['min']:.3f}, max {s['max']:.3f}; undefined on "
                   f"{s['undefined']})")
    if "rescore" in report:
        out += ["", f"## FDR vs SPR on the run's own trajectories ({report['rescore']['trajectories']} "
                f"from {', '.join(report['rescore']['stages'])})", "", "```"]
        out += [format_metrics(report["rescore"]["metrics"]), "```"]
    if report.get("plots"):
        out += ["", "## Plots", ""] + [f"![{name}]({path})" for name, path in report["plots"].items()]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
# Plots


def write_plots(folder: pathlib.Path, report: dict, curves: dict, rescored) -> dict:
    """success.png, ev.png, tiers.png, rewards.png, curves.png in `folder` (the run's `plots/`, or
    `plots-<split>/`; matplotlib, Agg)."""
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top

    folder.mkdir(exist_ok=True)
    rows = report["stages"]
    out = {}
    k = rows[0]["k"] if rows else 3

    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [100 * r["mean_at_k"] for r in rows], 0.4, label=f"Mean@{k}")
    ax.bar(x + 0.2, [100 * r["pass_at_1"] for r in rows], 0.4, label="Pass@1")
    ax.set_xticks(x, [r["name"] for r in rows])
    ax.set_ylabel(f"{_split(report)} success (%)")
    ax.set_title(f"Success per stage ({_split(report)})")
    ax.legend()
    fig.savefig(folder / "success.png", dpi=100)
    plt.close(fig)
    out["success per stage"] = f"{folder.name}/success.png"

    fig, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
    offset = 0
    for stage in EV_STAGES:
        pts = [p for p in report["critic"]["ev"] if p["stage"] == stage]
        if pts:
            ax.plot([offset + i + 1 for i in range(len(pts))],
                    [np.nan if p["ev"] is None else p["ev"] for p in pts], "o-", ms=3, label=stage)
            offset += len(pts)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("critic update (warm-up, then RPR-1, RPR-2)")
    ax.set_ylabel("explained variance")
    ax.set_title("Critic EV per update")
    if ax.get_legend_handles_labels()[0]:      # an arm without critic stages (rsr_only) has none
        ax.legend()
    fig.savefig(folder / "ev.png", dpi=100)
    plt.close(fig)
    out["EV per update"] = f"{folder.name}/ev.png"

    tiers = [t for t in ("easy", "medium", "hard", "extreme") if any(t in r["by_tier"] for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
    width = 0.8 / max(len(rows), 1)
    for i, r in enumerate(rows):
        ax.bar(np.arange(len(tiers)) + i * width, [100 * (r["by_tier"].get(t) or 0) for t in tiers],
               width, label=r["name"])
    ax.set_xticks(np.arange(len(tiers)) + 0.4 - width / 2, tiers)
    ax.set_ylabel(f"{_split(report)} Mean@{k} (%)")
    ax.set_title("Success by tier per stage")
    ax.legend()
    fig.savefig(folder / "tiers.png", dpi=100)
    plt.close(fig)
    out["success by tier"] = f"{folder.name}/tiers.png"

    if rescored is not None:
        metrics, rewards, strict, _ = rescored
        plot_rewards(rewards, strict, metrics, str(folder / "rewards.png"))
        out["FDR vs SPR rewards"] = f"{folder.name}/rewards.png"

    if curves:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
        for stage, c in curves.items():
            its = c["iterations"]
            if its:
                axes[0].plot([i["iteration"] for i in its],
                             [i["pass_rate"] if i["pass_rate"] is not None else np.nan for i in its],
                             "o-", ms=3, label=stage)
            if c["val"]:
                axes[1].plot([v["step"] for v in c["val"]], [v["pass@1"] or 0 for v in c["val"]],
                             "o-", ms=3, label=stage)
        axes[0].set_title("training rollouts: pass rate per iteration")
        axes[0].set_xlabel("iteration")
        axes[1].set_title("val Pass@1 per evaluated step")
        axes[1].set_xlabel("update")
        for a in axes:
            a.legend(fontsize=7)
        fig.savefig(folder / "curves.png", dpi=100)
        plt.close(fig)
        out["training curves"] = f"{folder.name}/curves.png"
    return out


# ------------------------------------------------------------------------------------------------
# Merging ablation runs


def base_hash(report: dict) -> str | None:
    """The actor hash of a report's Base row (None for reports written before rows carried it)."""
    for row in report.get("stages", []):
        if row.get("name") == "base":
            return row.get("actor_hash")
    return None


def _base_suffix(base: str | None) -> str:
    return f" base {base[:8]}" if base else ""


def merge_reports(reports: Sequence[dict]) -> dict:
    """Per arm: the seeds and mean ± std (population over seeds) of each row's test Mean@k.  An arm
    whose report records its Base (`base_hash`) is labelled with it, so runs of one seed from two
    machines stay two rows."""
    arms: dict = {}
    for rep in reports:
        base = base_hash(rep)
        cell = arm_label(rep) + _base_suffix(base)
        arm = arms.setdefault(cell, {"seeds": [], "rows": {}})
        if rep["seed"] in arm["seeds"]:
            raise ValueError(f"arm {cell!r} has seed {rep['seed']} twice")
        arm["seeds"].append(rep["seed"])
        arm.setdefault("bases", []).append(base)
        for row in rep["stages"]:
            arm["rows"].setdefault(row["name"], []).append(row["mean_at_k"])
    for arm in arms.values():
        arm["stats"] = {name: {"mean": statistics.fmean(v),
                               "std": statistics.pstdev(v) if len(v) > 1 else 0.0, "n": len(v)}
                        for name, v in arm["rows"].items()}
    return {"arms": dict(sorted(arms.items()))}


def factorial_effects(reports: Sequence[dict]) -> dict:
    """Effects of the 2^3 factorial per λ, on each stage row's test Mean@k (pure).

    With signs s_f(cell) = +1 at a factor's second level (token_gae, fdr, reset) and -1 at its
    first, an effect over the 8 cells y(cell) of one seed is
        E = (1/4) sum_cell s(cell) y(cell),   s = s_f (main effect) or s_f s_g (interaction),
    i.e. mean(y | s = +1) - mean(y | s = -1): a main effect is the second level minus the first
    averaged over the other two factors; an interaction is half the change of one factor's
    effect between the other's levels.  Computed per seed that ran all 8 cells at that λ (and
    row; the rows after RSR-1, where the factors act), then mean ± population std over them.
    Cells enter one factorial only with the same Base checkpoint (`base_hash`): a seed's cells run
    on two kinds of machine start from two Bases, and their differences would be the machines'."""
    names = list(FACTORS)
    # with one seed the 3-way interaction is the usual yardstick of noise in an unreplicated 2^3
    contrasts = names + [f"{a} x {b}" for i, a in enumerate(names) for b in names[i + 1:]] + [
        " x ".join(names)]
    table: dict = {}
    for rep in reports:
        info = rep.get("ablation") or {}
        cell = info.get("cell") or ""
        if cell not in CELLS:
            continue
        lam = float(info.get("lam", 1.0))
        group = (lam, base_hash(rep))
        for row in rep["stages"]:
            if row["name"] in ("base", "rsr1"):  # before any factor acts: the same in every cell
                continue
            table.setdefault(group, {}).setdefault(rep["seed"], {}).setdefault(
                row["name"], {})[cell] = row["mean_at_k"]
    out = {}
    for (lam, base), seeds in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        per_row: dict = {}
        for seed, rows in sorted(seeds.items()):
            for name, ys in rows.items():
                if len(ys) < len(CELLS):
                    continue
                for contrast in contrasts:
                    total = 0.0
                    for cell, y in ys.items():
                        levels = dict(zip(names, cell.split("/")))
                        sign = 1.0
                        for factor in contrast.split(" x "):
                            sign *= 1.0 if levels[factor] == FACTORS[factor][1] else -1.0
                        total += sign * y
                    per_row.setdefault(name, {}).setdefault(contrast, []).append(
                        (seed, total / (len(CELLS) / 2)))
        if per_row:
            out[f"{lam:g}" + _base_suffix(base)] = {
                name: {c: {"mean": statistics.fmean(v for _, v in vals),
                           "std": statistics.pstdev([v for _, v in vals]) if len(vals) > 1 else 0.0,
                           "seeds": [s for s, _ in vals]}
                       for c, vals in effects.items()}
                for name, effects in per_row.items()}
    return out


def merge_markdown(merged: dict) -> str:
    rows = [r for r in REPORT_ROWS if any(r in a["stats"] for a in merged["arms"].values())]
    out = ["| arm | seeds | " + " | ".join(rows) + " |", "|---" * (len(rows) + 2) + "|"]
    for cell, arm in merged["arms"].items():
        cells = []
        for r in rows:
            s = arm["stats"].get(r)
            cells.append("" if s is None else f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}")
        out.append(f"| {cell} | {len(arm['seeds'])} | " + " | ".join(cells) + " |")
    text = "test Mean@k (%), mean ± std over seeds\n\n" + "\n".join(out) + "\n"
    by_seed: dict = {}
    for cell, arm in merged["arms"].items():
        for seed, base in zip(arm["seeds"], arm.get("bases") or [None] * len(arm["seeds"])):
            by_seed.setdefault(seed, {}).setdefault(base[:8] if base else "unrecorded", []).append(cell)
    for seed, bases in sorted(by_seed.items()):
        if len(bases) > 1:
            text += (f"\n**Seed {seed} ran from {len(bases)} different Base checkpoints** (the same "
                     "seed on another kind of CPU trains another Base); compare arms within one: "
                     + "; ".join(f"{b}: {', '.join(sorted(c))}" for b, c in sorted(bases.items()))
                     + "\n")
    for lam, rows_ in merged.get("effects", {}).items():
        names = [r for r in REPORT_ROWS if r in rows_]
        contrasts = list(rows_[names[0]])
        seeds = rows_[names[0]][contrasts[0]]["seeds"]
        text += (f"\nFactorial effects at λ = {lam} (points of test Mean@k; second level minus first: "
                 f"{', '.join(f'{f} {b} - {a}' for f, (a, b) in FACTORS.items())}; mean ± std over "
                 f"seeds {seeds})\n\n| effect | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1)
                 + "|\n")
        for c in contrasts:
            text += f"| {c} | " + " | ".join(
                f"{100 * rows_[n][c]['mean']:+.1f} ± {100 * rows_[n][c]['std']:.1f}" for n in names) + " |\n"
    return text


def merge(paths: Sequence[str], out: str) -> dict:
    reports = []
    for p in paths:
        path = pathlib.Path(p)
        path = path / "report.json" if path.is_dir() else path
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a readable report.json ({error})") from None
    merged = merge_reports(reports)
    merged["effects"] = factorial_effects(reports)
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ablation.json").write_text(json.dumps(merged, indent=1, sort_keys=True))
    (folder / "ablation.md").write_text(merge_markdown(merged))
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top

    arms = list(merged["arms"])
    final = [merged["arms"][a]["stats"].get("rpr2") or merged["arms"][a]["stats"].get("rsr2")
             or {"mean": 0.0, "std": 0.0} for a in arms]
    effects = merged["effects"]
    width = max(6, len(arms) * 0.9)
    fig, axes = plt.subplots(1, 2 if effects else 1, figsize=(width + (6 if effects else 0), 4),
                             constrained_layout=True, squeeze=False,
                             gridspec_kw={"width_ratios": [width, 6] if effects else [1]})
    ax = axes[0, 0]
    ax.bar(range(len(arms)), [100 * s["mean"] for s in final],
           yerr=[100 * s["std"] for s in final], capsize=3)
    ax.set_xticks(range(len(arms)), arms, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("final stage test Mean@k (%)")
    ax.set_title("Ablation: mean ± std over seeds")
    if effects:
        ax = axes[0, 1]
        bar = 0.8 / len(effects)
        for i, (lam, rows_) in enumerate(effects.items()):
            last = rows_.get("rpr2") or rows_[list(rows_)[-1]]
            xs = np.arange(len(last)) + i * bar
            ax.bar(xs, [100 * e["mean"] for e in last.values()], bar,
                   yerr=[100 * e["std"] for e in last.values()], capsize=3, label=f"λ={lam}")
            ax.set_xticks(np.arange(len(last)) + 0.4 - bar / 2, list(last), rotation=40, ha="right",
                          fontsize=7)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel("effect on final test Mean@k (points)")
        ax.set_title("Factorial effects (second level - first)")
        ax.legend(fontsize=7)
    fig.savefig(folder / "ablation.png", dpi=100)
    plt.close(fig)
    return merged


# ------------------------------------------------------------------------------------------------
# Running the arms of one seed


def shared_stages(cell: str, donor: str, *, same_lam: bool = True) -> list[str]:
    """Stage folders arm `cell` can take from arm `donor`'s finished run of the same seed (pure).

    Every arm's `base` is the same stage; every arm but `direct_ppo` has the same `rsr1` (neither
    reads the estimator, the rewards or the critic); the factorial cells' `warmup` depends on the
    estimator and its λ only (its critic targets), not on the rewards of RPR-2 or a later reset;
    two cells that differ only in the rewards (FDR -> SPR vs FDR only: the rewards differ from
    RPR-2 on) also share RPR-1 and RSR-2 (measured: the same actor hashes, 3 Dec)."""
    out = ["base"]
    if "direct_ppo" not in (cell, donor):
        out.append("rsr1")
    if "/" in cell and "/" in donor and cell.split("/")[0] == donor.split("/")[0] and same_lam:
        out.append("warmup")
        if cell.split("/")[2] == donor.split("/")[2]:
            out += ["rpr1", "rsr2"]
    return out


def cell_dirname(cell: str) -> str:
    return cell.replace("/", "-")


def seed_cells(root, seed: int, cells: Sequence[str], *, variant: str = "ablation",
               lam: float = FACTORIAL_LAM, python: str = sys.executable,
               extra: Sequence[str] = ()) -> list[pathlib.Path]:
    """Runs ablation arms `cells` of `seed` one after another (`experiments/main.py`, `variant` of
    experiments/terminal_rsi.py with `ablation.cell` and `ablation.lam` set) in ROOT/seed-S/<arm>.
    An arm with a report.json is skipped; each new arm first copies the finished stage folders
    (and their cached test evaluations) it shares with an arm already run (`shared_stages`; a
    warm-up only from a donor of the same λ), so Base and RSR-1 are trained once per seed.  A copy
    lands whole or not at all (copied beside, then renamed)."""
    for cell in cells:
        if cell not in ARMS:
            raise ConfigError(f"ablation arm {cell!r}: expected one of {ARMS}")
    folder = pathlib.Path(root) / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    repo = pathlib.Path(__file__).resolve().parents[2]
    done = []
    for cell in cells:
        work = folder / cell_dirname(cell)
        if not (work / "report.json").exists():
            for donor in ARMS:
                src = folder / cell_dirname(donor)
                if donor == cell or not (src / "report.json").exists():
                    continue
                donor_info = json.loads((src / "report.json").read_text()).get("ablation") or {}
                for stage in shared_stages(cell, donor,
                                           same_lam=donor_info.get("lam", 1.0) == lam):
                    for sub in (stage, f"report-evals/{stage}"):
                        if (src / sub).is_dir() and not (work / sub).exists():
                            tmp = (work / sub).with_name(f".{stage}.copy")
                            shutil.rmtree(tmp, ignore_errors=True)
                            shutil.copytree(src / sub, tmp)
                            tmp.rename(work / sub)
            print(f"[ablation] seed {seed} arm {cell} -> {work}", flush=True)
            with open(folder / f"{cell_dirname(cell)}.log", "a", encoding="utf-8") as log:
                code = subprocess.call(
                    [python, str(repo / "experiments" / "main.py"),
                     f"--config={repo / 'experiments' / 'terminal_rsi.py'}:{variant}",
                     f"--config.ablation.cell={cell}", f"--config.ablation.lam={lam}",
                     f"--config.seed={seed}",
                     f"--workdir={work}", *extra], stdout=log, stderr=subprocess.STDOUT,
                    cwd=repo, env={**os.environ, "JAX_PLATFORMS": os.environ.get(
                        "JAX_PLATFORMS", "cpu")})
            if code != 0:
                raise RuntimeError(f"ablation arm {cell} seed {seed} exited with {code}; its log: "
                                   f"{folder / (cell_dirname(cell) + '.log')}")
        done.append(work)
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tr.stages.terminal_rsi")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge ablation runs' report.json")
    m.add_argument("runs", nargs="+", help="run directories (or report.json files)")
    m.add_argument("--out", required=True)
    c = sub.add_parser("cells", help="run ablation arms of one seed, sharing finished stages")
    c.add_argument("--seed", type=int, required=True)
    c.add_argument("--root", required=True, help="runs go to ROOT/seed-S/<arm>")
    c.add_argument("--cells", nargs="*", default=list(ARMS), help=f"arms (default all: {ARMS})")
    c.add_argument("--variant", default="ablation", help="experiments/terminal_rsi.py variant")
    c.add_argument("--lam", type=float, default=FACTORIAL_LAM,
                   help="λ of both estimators' clocks in the factorial's cells")
    args = parser.parse_args(argv)
    if args.command == "cells":
        try:
            runs = seed_cells(args.root, args.seed, args.cells, variant=args.variant, lam=args.lam)
        except (ConfigError, RuntimeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        merged = merge([str(r) for r in runs], str(pathlib.Path(args.root) / f"seed-{args.seed}"))
        print(merge_markdown(merged))
        return 0
    try:
        merged = merge(args.runs, args.out)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(merge_markdown(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
