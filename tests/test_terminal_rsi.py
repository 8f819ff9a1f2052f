"""Terminal-RSI (issue 14): `experiments/terminal_rsi.py:quick` end to end through the entry point
(real gym rollouts in local sandboxes, real checkpoints, the report), a second start re-running
nothing, the paper variant validating, the ablation's arms and the merge command."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAIN = ROOT / "experiments" / "main.py"
sys.path.insert(0, str(ROOT))

from tr.stages import terminal_rsi  # noqa: E402  pylint: disable=wrong-import-position
from tr.stages.registry import STAGE_KINDS, ConfigError  # noqa: E402  pylint: disable=wrong-import-position


def _experiment():
    import importlib.util
    spec = importlib.util.spec_from_file_location("terminal_rsi_config",
                                                  ROOT / "experiments" / "terminal_rsi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


experiment = _experiment()

REPORT_KEYS = {"experiment", "variant", "seed", "wall_s", "stages", "critic"}
ROW_KEYS = {"name", "split", "k", "episodes", "mean_at_k", "pass_at_1", "by_family", "by_tier"}
# A stage kind not built in this checkout (issue 13's rsr) is left out, loudly (the default).
SKIP = [] if "rsr" in STAGE_KINDS else ["--config.missing_kinds=skip"]


def run_main(*args, timeout=2400):   # a guard against a hang; quick takes minutes alone
    return subprocess.run([sys.executable, str(MAIN), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rsi")
    result = run_main("--config=experiments/terminal_rsi.py:quick", f"--workdir={workdir}", *SKIP)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir, result


def test_quick_runs_end_to_end_and_writes_the_report(quick_run):
    workdir, result = quick_run
    report = json.loads((workdir / "report.json").read_text())
    assert REPORT_KEYS <= set(report)
    assert report["experiment"] == "terminal_rsi" and report["variant"] == "quick"
    assert report["seed"] == 0 and report["wall_s"] > 0
    machine = report["machine"]   # runs compare only within one kind of machine
    assert machine["cores"] >= 1 and machine["cpu"] and machine["backend"] == "cpu" and machine["jax"]
    names = [row["name"] for row in report["stages"]]
    expected = [n for n in terminal_rsi.REPORT_ROWS
                if n not in {s["name"] for s in report["skipped"]}]
    assert names == expected
    for row in report["stages"]:
        assert ROW_KEYS <= set(row)
        assert row["split"] == "test" and row["k"] == 3 and row["episodes"] == 3 * 4
        assert 0.0 <= row["pass_at_1"] <= 1.0 and 0.0 <= row["mean_at_k"] <= 1.0
        # Mean@3 by tier averages the tasks of the tier, which together are all the tasks.
        assert set(row["by_tier"]) <= {"easy", "medium", "hard", "extreme"}
    ev = report["critic"]["ev"]
    assert {p["stage"] for p in ev} == {"warmup", "rpr1", "rpr2"}
    assert all(set(p) >= {"stage", "update", "ev"} for p in ev)
    for stage in ("warmup", "rpr1", "rpr2"):
        updates = [p["update"] for p in ev if p["stage"] == stage]
        assert updates == sorted(updates) and updates[0] == 1
    # RPR and the warm-up trained on packed rows (arrays.pack_multiple = 2 in `quick`): the
    # fewest even number of rows that hold each batch, never more than arrays.rows = 4.
    for stage in ("warmup", "rpr1", "rpr2"):
        for line in map(json.loads, (workdir / stage / "metrics.jsonl").read_text().splitlines()):
            arrays = line["arrays"]
            assert arrays["rows"] in (2, 4) and 0 < arrays["fill"] <= 1, (stage, arrays)
            assert arrays["tokens"] == round(arrays["fill"] * arrays["rows"] * 512), (stage, arrays)
            # the iteration's wall seconds per part, each measured
            assert set(line["seconds"]) == {"rollouts", "arrays", "targets", "updates"}, line
            assert all(s >= 0 for s in line["seconds"].values()) and line["seconds"]["updates"] > 0
    # The retained actors were evaluated: episodes on disk, one eval.json per stage; each row's
    # hash is that of the checkpoint it evaluated (restored here), the final one where retained.
    from tr.train.checkpoint import tree_hash
    for row in report["stages"]:
        assert (workdir / "report-evals" / row["stage"] / "eval.json").is_file()
        summary = json.loads((workdir / row["stage"] / "summary.json").read_text())
        params = terminal_rsi.restore_actor(workdir, row["stage"], row["retained_step"])[3]
        assert len(row["actor_hash"]) == 64 and row["actor_hash"] == tree_hash(params)
        if row["retained_step"] == summary["finished_step"]:
            assert row["actor_hash"] == summary["actor_hash"]
    assert terminal_rsi.base_hash(report) == report["stages"][0]["actor_hash"]
    first_of = {}   # a stage whose retained actor was already evaluated (kept its step 0) reuses it
    for row in report["stages"]:
        first = first_of.setdefault(row["actor_hash"], row)
        if first is row:
            assert "same_actor_as" not in row
        else:
            assert row["same_actor_as"] == first["stage"] and row["eval_s"] == 0.0
            assert (row["mean_at_k"], row["pass_at_1"]) == (first["mean_at_k"], first["pass_at_1"])
    for plot in ("success", "ev", "tiers", "rewards", "curves"):
        assert (workdir / "plots" / f"{plot}.png").stat().st_size > 1000
    text = (workdir / "report.md").read_text()
    assert "Success per stage" in text and "explained variance" in text
    assert "RPR-2 - Base" in result.stdout


def test_a_second_start_reruns_no_stage(quick_run):
    workdir, _ = quick_run
    before = {p: p.stat().st_mtime_ns for p in workdir.glob("*/summary.json")}
    evals = {p: p.stat().st_mtime_ns for p in workdir.glob("report-evals/*/eval.json")}
    result = run_main("--config=experiments/terminal_rsi.py:quick", f"--workdir={workdir}", *SKIP)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in workdir.glob("*/summary.json")} == before
    assert {p: p.stat().st_mtime_ns for p in workdir.glob("report-evals/*/eval.json")} == evals


def test_a_report_on_val_keeps_the_test_report(quick_run):
    """`--config.report.split=val` on a finished run evaluates the retained actors on `val` into
    report-val.json / report-evals-val/ / plots-val/: the test report and its cached evaluations
    (keyed by step, tasks and sampling) are neither reused nor overwritten."""
    workdir, _ = quick_run
    test_files = {p: p.read_bytes() for p in [workdir / "report.json", workdir / "report.md",
                                              *workdir.glob("report-evals/*/eval.json")]}
    result = run_main("--config=experiments/terminal_rsi.py:quick", f"--workdir={workdir}",
                      "--config.report.split=val", *SKIP)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p: p.read_bytes() for p in test_files} == test_files
    report = json.loads((workdir / "report-val.json").read_text())
    test_report = json.loads(test_files[workdir / "report.json"])
    assert [r["stage"] for r in report["stages"]] == [r["stage"] for r in test_report["stages"]]
    for row in report["stages"]:
        assert row["split"] == "val"
        data = json.loads((workdir / "report-evals-val" / row["stage"] / "eval.json").read_text())
        test_data = json.loads((workdir / "report-evals" / row["stage"] / "eval.json").read_text())
        assert data["settings"]["split"] == "val" and test_data["settings"]["split"] == "test"
        assert not set(data["settings"]["tasks"]) & set(test_data["settings"]["tasks"])
    assert (workdir / "plots-val" / "success.png").stat().st_size > 1000
    assert "Success per stage (val)" in (workdir / "report-val.md").read_text()


def test_a_stage_whose_actor_was_evaluated_reuses_the_evaluation(tmp_path):
    """Same retained actor hash (e.g. RSR-2 kept its step 0, RPR-1's actor): the report takes the
    evaluation already made (no checkpoint is read, nothing sampled), caches it under the stage,
    says whose it is, and a second start reads that cache."""
    (tmp_path / "rsr2").mkdir()
    (tmp_path / "rsr2" / "summary.json").write_text(json.dumps({"retained_step": 0, "actor_hash": "ab" * 32}))
    source = {"stage": "rpr1", "retained_step": 17, "eval_s": 150.0, "k": 3, "episodes": 192,
              "overall": {"pass@1": 0.25, "mean@3": 0.3}, "by_family": {"sum-column": {"pass@1": 0.5, "mean@3": 0.5}},
              "by_tier": {"easy": {"mean@3": 0.4}}}
    rc = experiment.get_config("quick").report
    source["settings"] = terminal_rsi.evaluation_settings(rc, [], 0)
    data = terminal_rsi.evaluate_stage(tmp_path, "rsr2", rc, [], seed=0, same_actor=source)
    assert data["stage"] == "rsr2" and data["retained_step"] == 0 and data["same_actor_as"] == "rpr1"
    assert data["eval_s"] == 0.0 and data["overall"] == source["overall"]
    assert json.loads((tmp_path / "report-evals" / "rsr2" / "eval.json").read_text()) == data
    assert terminal_rsi.evaluate_stage(tmp_path, "rsr2", rc, [], seed=0) == data         # the cache
    row = terminal_rsi.stage_row("rsr2", data, "test")
    assert row["same_actor_as"] == "rpr1" and row["mean_at_k"] == 0.3 and row["pass_at_1"] == 0.25
    (tmp_path / "rpr2").mkdir()   # RPR-2 kept its step 0 too: still RPR-1's evaluation
    (tmp_path / "rpr2" / "summary.json").write_text(json.dumps({"retained_step": 0, "actor_hash": "ab" * 32}))
    chained = terminal_rsi.evaluate_stage(tmp_path, "rpr2", rc, [], seed=0, same_actor=data)
    assert chained["stage"] == "rpr2" and chained["same_actor_as"] == "rpr1"


def test_shared_stages_follow_the_factors():
    assert terminal_rsi.shared_stages("tb_gae/fdr/reset", "tb_gae/fdr_spr/inherit") == [
        "base", "rsr1", "warmup"]
    assert terminal_rsi.shared_stages("token_gae/fdr/reset", "tb_gae/fdr/reset") == ["base", "rsr1"]
    assert terminal_rsi.shared_stages("rsr_only", "tb_gae/fdr/reset") == ["base", "rsr1"]
    assert terminal_rsi.shared_stages("direct_ppo", "rsr_only") == ["base"]
    assert terminal_rsi.shared_stages("tb_gae/fdr/reset", "direct_ppo") == ["base"]
    assert terminal_rsi.shared_stages("tb_gae/fdr/reset", "tb_gae/fdr_spr/inherit",
                                      same_lam=False) == ["base", "rsr1"]
    assert terminal_rsi.shared_stages("tb_gae/fdr/reset", "tb_gae/fdr_spr/reset") == [
        "base", "rsr1", "warmup", "rpr1", "rsr2"]
    assert terminal_rsi.shared_stages("tb_gae/fdr/reset", "tb_gae/fdr_spr/reset", same_lam=False) == [
        "base", "rsr1"]
    # what the rule rests on: every shared stage is configured the same in both arms' schedules
    config = experiment.get_config("ablation")
    for cell, donor in [("tb_gae/fdr/reset", "tb_gae/fdr_spr/reset"),
                        ("token_gae/fdr_spr/inherit", "token_gae/fdr/inherit"),
                        ("tb_gae/fdr/reset", "tb_gae/fdr_spr/inherit")]:
        stages = {}
        for arm in (cell, donor):
            config.ablation.cell = arm
            entries, shared, _, _ = terminal_rsi.schedule(config)
            stages[arm] = {e["name"]: terminal_rsi.pipeline.merge_entry(shared, e) for e in entries}
        for name in terminal_rsi.shared_stages(cell, donor):
            assert stages[cell][name] == stages[donor][name], (cell, donor, name)
        assert stages[cell]["rpr2"] != stages[donor]["rpr2"]


def test_ablation_estimators_differ_only_below_unit_lambda():
    """The factorial's cells set λ on both clocks; at γ = λ = 1 TB-GAE is token GAE (SPEC §2), so
    a factorial cell at λ = 1 is refused, naming the field; direct_ppo / rsr_only are not affected."""
    config = experiment.get_config("ablation")
    assert config.ablation.lam < 1
    for cell in ("tb_gae/fdr/reset", "token_gae/fdr_spr/inherit"):
        config.ablation.cell = cell
        _, shared, _, _ = terminal_rsi.schedule(config)
        ppo = shared["train"]["ppo"]
        assert (ppo["estimator"], ppo["lam_turn"], ppo["lam"]) == (cell.split("/")[0], 0.95, 0.95)
    config.ablation.lam = 1.0
    with pytest.raises(ConfigError, match="ablation.lam"):
        terminal_rsi.schedule(config)
    config.ablation.cell = "direct_ppo"
    _, shared, _, _ = terminal_rsi.schedule(config)
    assert shared["train"]["ppo"]["lam_turn"] == 1.0       # the default run's λ
    # the same cell at two λ: two arms in a merged table; reports from before λ ran at 1
    info = {"cell": "tb_gae/fdr/reset", "factors": {}}
    assert terminal_rsi.arm_label({"ablation": info}) == "tb_gae/fdr/reset"
    assert terminal_rsi.arm_label({"ablation": {**info, "lam": 0.95}}) == "tb_gae/fdr/reset λ=0.95"


def test_cells_command_reuses_a_seeds_finished_stages(quick_run, tmp_path):
    """`cells` runs an arm from the stages an earlier arm of its seed finished: the `rsr_only` arm
    trains only RSR-2; Base and RSR-1 (and their test evaluations) are the donor's, untouched."""
    workdir, _ = quick_run
    donor = tmp_path / "seed-0" / "tb_gae-fdr_spr-inherit"
    __import__("shutil").copytree(workdir, donor)
    stamps = {p.relative_to(donor): p.stat().st_mtime_ns
              for p in donor.glob("*/summary.json")}
    out = subprocess.run([sys.executable, "-m", "tr.stages.terminal_rsi", "cells", "--seed", "0",
                          "--root", str(tmp_path), "--variant", "quick", "--cells",
                          "tb_gae/fdr_spr/inherit", "rsr_only"], cwd=ROOT, capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    arm = tmp_path / "seed-0" / "rsr_only"
    report = json.loads((arm / "report.json").read_text())
    assert report["ablation"]["cell"] == "rsr_only"
    assert [r["name"] for r in report["stages"]] == ["base", "rsr1", "rsr2"]
    donor_rows = {r["name"]: r for r in json.loads((donor / "report.json").read_text())["stages"]}
    for row in report["stages"][:2]:
        assert row["mean_at_k"] == donor_rows[row["name"]]["mean_at_k"]
    for stage in ("base", "rsr1"):     # copied, not re-run
        assert (arm / stage / "summary.json").stat().st_mtime_ns == stamps[
            pathlib.Path(stage) / "summary.json"]
    assert not (arm / "warmup").exists() and (arm / "rsr2" / "summary.json").exists()
    assert {p.relative_to(donor): p.stat().st_mtime_ns
            for p in donor.glob("*/summary.json")} == stamps      # the donor is left alone
    assert "rsr_only" in (tmp_path / "seed-0" / "ablation.md").read_text()
    bad = subprocess.run([sys.executable, "-m", "tr.stages.terminal_rsi", "cells", "--seed", "0",
                          "--root", str(tmp_path), "--cells", "tb_gae/spr/inherit"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "tb_gae/spr/inherit" in bad.stderr


def test_paper_variant_loads_and_validates(tmp_path):
    config = experiment.get_config("paper")
    assert config.validate_only
    # the paper's backbone with the summarisation threshold's context (the sampler caches it)
    assert config.stage_defaults.model.name == "qwen3-27b-32k"
    assert config.stage_defaults.rollout.context == config.paper.summary_at_tokens == 32768
    assert config.stage_defaults.rollout.tasks_per_iteration == 256
    assert 256 + config.stage_defaults.rollout.oversample == 288
    assert config.stage_defaults.train.actor.optimizer.learning_rate == 5e-7
    assert config.stages[-1]["train"]["actor"]["optimizer"]["learning_rate"] == 1e-7
    assert config.pod.mesh.context == 4
    result = run_main("--config=experiments/terminal_rsi.py:paper", f"--workdir={tmp_path}", *SKIP)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "validated.json").read_text())
    assert info["model"]["params_millions"] > 20_000


def test_schedule_matches_the_issue():
    by_name = {e["name"]: e for e in experiment.get_config("default").stages}
    assert by_name["rpr1"]["critic_from"] == "warmup" and by_name["rpr1"]["rpr"]["reward"] == "fdr"
    assert by_name["rpr2"]["critic_from"] == "rpr1" and by_name["rpr2"]["rpr"]["reward"] == "spr"
    lr = experiment.get_config("default").stage_defaults.train.actor.optimizer.learning_rate
    assert by_name["rpr2"]["train"]["actor"]["optimizer"]["learning_rate"] == pytest.approx(lr / 5)


def test_ablation_arms_are_compute_matched_rewrites():
    config = experiment.get_config("ablation")
    entries = [dict(e) for e in config.stages]
    report = dict(config.report.stages)
    plain, _, _ = terminal_rsi.arm_stages(entries, report, "")
    for cell in experiment.CELLS:
        arm, rows, shared = terminal_rsi.arm_stages(entries, report, cell)
        estimator, rewards, critic = cell.split("/")
        by_name = {e["name"]: e for e in arm}
        assert shared["train"]["ppo"]["estimator"] == estimator
        assert by_name["rpr2"]["rpr"]["reward"] == ("fdr" if rewards == "fdr" else "spr")
        assert by_name["rpr1"]["critic_from"] == ("fresh" if critic == "reset" else "warmup")
        # same stages, rollouts and updates in every arm
        assert [e["name"] for e in arm] == [e["name"] for e in plain]
        assert [e.get("rpr", {}).get("iterations") for e in arm] == \
            [e.get("rpr", {}).get("iterations") for e in plain]
    arm, rows, _ = terminal_rsi.arm_stages(entries, report, "direct_ppo")
    assert [e["name"] for e in arm] == ["base", "ppo"] and rows == {"base": "base", "rpr2": "ppo"}
    assert arm[1]["critic_from"] == "fresh" and arm[1]["rpr"]["iterations"] == sum(
        e["rpr"]["iterations"] for e in plain if e["kind"] == "rpr")
    with pytest.raises(ConfigError, match="ablation.cell"):
        terminal_rsi.arm_stages(entries, report, "tb_gae/spr/inherit")


def test_merge_gives_mean_and_std_per_arm(tmp_path):
    def report(cell, seed, base, final):
        return {"variant": "ablation", "seed": seed, "ablation": {"cell": cell},
                "stages": [{"name": "base", "mean_at_k": base}, {"name": "rpr2", "mean_at_k": final}]}
    dirs = []
    for i, (cell, seed, final) in enumerate([("a/b/c", 0, 0.2), ("a/b/c", 1, 0.4),
                                             ("direct_ppo", 0, 0.1)]):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "report.json").write_text(json.dumps(report(cell, seed, 0.1, final)))
        dirs.append(str(d))
    out = subprocess.run([sys.executable, "-m", "tr.stages.terminal_rsi", "merge", *dirs,
                          "--out", str(tmp_path / "merged")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    merged = json.loads((tmp_path / "merged" / "ablation.json").read_text())
    stats = merged["arms"]["a/b/c"]["stats"]["rpr2"]
    assert stats["mean"] == pytest.approx(0.3) and stats["std"] == pytest.approx(0.1)
    assert merged["arms"]["a/b/c"]["seeds"] == [0, 1]
    assert "30.0 ± 10.0" in (tmp_path / "merged" / "ablation.md").read_text()
    assert (tmp_path / "merged" / "ablation.png").stat().st_size > 1000
    bad = subprocess.run([sys.executable, "-m", "tr.stages.terminal_rsi", "merge",
                          str(tmp_path / "nope"), "--out", str(tmp_path / "m2")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_stage_rollouts_use_the_configured_context():
    """`rollout.context` reaches the stages' rollouts: the untrained model's 64-token turns fill
    the context until the harness ends the episode (`context_overflow`), at 512 + 64 tokens under
    the bucket rule (0) and at 1,024 with `context=1024` (a record's `context_tokens` counts the
    last observation too: 592-594 and 1,094-1,116 tokens on 2 Dec)."""
    import ml_collections

    from tr.models import embedded
    from tr.stages.actor import Actor
    from tr.stages.splits import stage_tasks
    from tr.stages.stage_config import stage_defaults
    from tr.stages.stage_models import build_models

    models = build_models(ml_collections.ConfigDict({"name": embedded.MODEL}),
                          tokenizer=embedded.TOKENIZER,
                          system_prompt=embedded.SYSTEM_PROMPT)
    tasks = stage_tasks(ml_collections.ConfigDict({"source": "gym", "count": 2, "seed": 0}),
                        "train")
    rollout = stage_defaults().rollout
    rollout.update(concurrency=4, max_output_tokens=64, max_turns=12)
    lengths = {}
    with Actor(models, rollout) as actor:
        for context in (0, 1024):
            actor.config.context = context
            # a wall budget far above the task's own: on a loaded machine the agent timeout came
            # first (agent_timeout, 3 Dec), and the context is what this test is about
            records, _ = actor.rollouts(tasks, seed=0, group_size=2, wall_time_s=3600)
            assert {r.status.value for r in records} == {"context_overflow"}, context
            lengths[context] = [r.context_tokens for r in records]
    assert max(lengths[0]) < 800 < min(lengths[1024]), lengths


def test_factorial_effects_match_differences_of_cell_means(tmp_path):
    rng = np.random.default_rng(3)
    y = {(seed, cell): float(rng.uniform(0.1, 0.5)) for seed in (0, 1) for cell in terminal_rsi.CELLS}
    reports = [{"variant": "ablation", "seed": seed, "ablation": {"cell": cell, "lam": 0.95},
                "stages": [{"name": "rpr2", "mean_at_k": v}]} for (seed, cell), v in y.items()]
    # seed 2 lacks a cell: no effect from it; a λ = 1 report and direct_ppo are not in the factorial
    reports += [{"variant": "ablation", "seed": 2, "ablation": {"cell": cell, "lam": 0.95},
                 "stages": [{"name": "rpr2", "mean_at_k": 0.9}]} for cell in terminal_rsi.CELLS[:7]]
    reports += [{"variant": "ablation", "seed": 0, "ablation": {"cell": "tb_gae/fdr/reset"},
                 "stages": [{"name": "rpr2", "mean_at_k": 0.0}]},
                {"variant": "ablation", "seed": 0, "ablation": {"cell": "direct_ppo", "lam": 0.95},
                 "stages": [{"name": "rpr2", "mean_at_k": 0.0}]}]
    # seed 5 ran its 8 cells from two Bases (two kinds of machine): no factorial from it;
    # seed 7's 8 cells share one recorded Base: a factorial of their own
    def with_base(seed, cell, base, value):
        return {"variant": "ablation", "seed": seed, "ablation": {"cell": cell, "lam": 0.95},
                "stages": [{"name": "base", "mean_at_k": 0.2, "actor_hash": base},
                           {"name": "rpr2", "mean_at_k": value}]}
    mixed = [with_base(5, cell, ("a" if i % 2 else "b") * 64, 0.1 * i)
             for i, cell in enumerate(terminal_rsi.CELLS)]
    one = [with_base(7, cell, "c" * 64, 0.3 if cell.endswith("reset") else 0.2)
           for cell in terminal_rsi.CELLS]
    effects = terminal_rsi.factorial_effects(reports + mixed + one)
    assert sorted(effects) == ["0.95", "0.95 base cccccccc"]
    assert effects["0.95 base cccccccc"]["rpr2"]["critic"]["mean"] == pytest.approx(0.1)
    assert effects["0.95 base cccccccc"]["rpr2"]["estimator"]["mean"] == pytest.approx(0.0)
    warning = terminal_rsi.merge_markdown(terminal_rsi.merge_reports(mixed))
    assert "Seed 5 ran from 2 different Base checkpoints" in warning and "aaaaaaaa" in warning
    assert "different Base" not in terminal_rsi.merge_markdown(terminal_rsi.merge_reports(one))
    # the same arm and seed from two machines: two rows, not "seed twice"
    both = terminal_rsi.merge_reports([reports[0], {**one[0], "seed": reports[0]["seed"]}])
    assert sorted(both["arms"]) == [f"{terminal_rsi.CELLS[0]} λ=0.95",
                                    f"{terminal_rsi.CELLS[0]} λ=0.95 base cccccccc"]
    effects = terminal_rsi.factorial_effects(reports)
    assert list(effects) == ["0.95"]
    rows = effects["0.95"]["rpr2"]

    def cell_mean(seed, **fixed):  # the obvious way: average of the cells at the given levels
        pick = [v for (s, cell), v in y.items() if s == seed and all(
            dict(zip(terminal_rsi.FACTORS, cell.split("/")))[f] == lv for f, lv in fixed.items())]
        return sum(pick) / len(pick)

    for factor, lo, hi in [("estimator", "tb_gae", "token_gae"), ("rewards", "fdr_spr", "fdr"),
                           ("critic", "inherit", "reset")]:
        per_seed = [cell_mean(s, **{factor: hi}) - cell_mean(s, **{factor: lo}) for s in (0, 1)]
        assert rows[factor]["mean"] == pytest.approx(np.mean(per_seed))
        assert rows[factor]["std"] == pytest.approx(np.std(per_seed))
        assert rows[factor]["seeds"] == [0, 1]
    # estimator x critic: half the change of the estimator's effect from inherit to reset
    per_seed = []
    for s in (0, 1):
        at = {c: cell_mean(s, estimator="token_gae", critic=c) - cell_mean(s, estimator="tb_gae", critic=c)
              for c in ("inherit", "reset")}
        per_seed.append((at["reset"] - at["inherit"]) / 2)
    assert rows["estimator x critic"]["mean"] == pytest.approx(np.mean(per_seed))
    # the 3-way interaction: half the change of the estimator x rewards interaction across critics
    per_seed = []
    for s in (0, 1):
        def inter(c, s=s):
            eff = {r: y[(s, f"token_gae/{r}/{c}")] - y[(s, f"tb_gae/{r}/{c}")] for r in ("fdr_spr", "fdr")}
            return (eff["fdr"] - eff["fdr_spr"]) / 2
        per_seed.append((inter("reset") - inter("inherit")) / 2)
    assert rows["estimator x rewards x critic"]["mean"] == pytest.approx(np.mean(per_seed))
    text = terminal_rsi.merge_markdown({**terminal_rsi.merge_reports(reports), "effects": effects})
    assert "Factorial effects at λ = 0.95" in text and "| rewards x critic |" in text
    for i, rep in enumerate(reports):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "report.json").write_text(json.dumps(rep))
    merged = terminal_rsi.merge([str(tmp_path / f"r{i}") for i in range(len(reports))],
                                str(tmp_path / "merged"))
    on_disk = json.loads((tmp_path / "merged" / "ablation.json").read_text())
    assert on_disk["effects"]["0.95"]["rpr2"]["critic"]["mean"] == pytest.approx(
        merged["effects"]["0.95"]["rpr2"]["critic"]["mean"])
    assert (tmp_path / "merged" / "ablation.png").stat().st_size > 1000


def test_command_line_rsr_settings_reach_both_rsr_stages_only():
    config = experiment.get_config("default")
    from tr.stages import rsr

    before, _, _, _ = terminal_rsi.schedule(config)
    # the default config.rsr restates what the RSR stages resolve to: no setting changes
    kind = rsr.defaults().rsr.to_dict()
    for entry, own in zip(before, config.stages):
        if entry["kind"] == "rsr":
            assert {**kind, **entry["rsr"]} == {**kind, **dict(own["rsr"])}
            assert "train" not in entry                      # the kind's SFT learning rate
        else:
            assert entry == terminal_rsi._plain(own)
    config.rsr.per_family, config.rsr.temperature, config.rsr.learning_rate = 8, 0.6, 1e-3
    after, shared, _, _ = terminal_rsi.schedule(config)
    rsr_stages = [e for e in after if e["kind"] == "rsr"]
    assert [e["name"] for e in rsr_stages] == ["rsr1", "rsr2"]
    for entry in rsr_stages:
        assert entry["rsr"]["per_family"] == 8 and entry["rsr"]["temperature"] == 0.6
        assert entry["rsr"]["explore_k"] == 4                  # untouched fields kept
        assert entry["train"]["actor"]["optimizer"]["learning_rate"] == 1e-3
        assert "learning_rate" not in entry["rsr"]
    others = [(a, b) for a, b in zip(before, after) if a["kind"] != "rsr"]
    assert others and all(a == b for a, b in others)
    # and the RSR kind accepts what was laid on it (a bad value names its field)
    terminal_rsi.validate(config)
    config.rsr.per_family = -1
    with pytest.raises(ConfigError, match="rsr.per_family"):
        terminal_rsi.validate(config)


def test_stage_table_names_the_split_it_was_evaluated_on():
    def row(name, split):
        return {"name": name, "split": split, "k": 3, "episodes": 12, "retained_step": 0,
                "mean_at_k": 0.25, "pass_at_1": 0.5, "by_family": {}, "by_tier": {"easy": 0.5}}

    for split in ("test", "val"):
        report = {"variant": "default", "seed": 0, "stages": [row("base", split)]}
        head = terminal_rsi.stage_table(report).splitlines()[0]
        assert f"seed 0: {split} (12 episodes per stage)" in head


def test_a_tempered_policy_needs_rollouts_at_its_temperature():
    config = experiment.get_config("default")
    config.stage_defaults.rollout.temperature = 1.0
    config.stage_defaults.train.policy_temperature = 0.6
    with pytest.raises(ConfigError, match="rollout.temperature = 1.0 but train.policy_temperature"):
        terminal_rsi.validate(config)
    config.stage_defaults.rollout.temperature = 0.6
    terminal_rsi.validate(config)
    config.stage_defaults.train.policy_temperature = 0.0
    config.stage_defaults.rollout.temperature = 0.0
    with pytest.raises(ConfigError, match="policy_temperature must be > 0"):
        terminal_rsi.validate(config)


def test_the_tempered_policy_is_set_from_the_command_line(tmp_path):
    """The flags the config's comments and the README give for training the 0.6-tempered policy
    name fields the experiment config has (a missing one is refused by the flag parser), and the
    check of `rpr` names both values when only one of them is given."""
    tau = ("--config.stage_defaults.rollout.temperature=0.6",
           "--config.stage_defaults.rollout.top_p=1.0")
    ok = run_main("--config=experiments/terminal_rsi.py", f"--workdir={tmp_path / 'ok'}",
                  "--config.validate_only=True", *tau,
                  "--config.stage_defaults.train.policy_temperature=0.6")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert (tmp_path / "ok" / "validated.json").is_file()
    bad = run_main("--config=experiments/terminal_rsi.py", f"--workdir={tmp_path / 'bad'}",
                   "--config.validate_only=True", *tau)
    assert bad.returncode != 0
    assert "rollout.temperature = 0.6 but train.policy_temperature" in bad.stderr + bad.stdout
