"""The entry point runs experiment configs end to end, and refuses bad ones clearly."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAIN = ROOT / "experiments" / "main.py"


def run_main(*args, timeout=300):
    return subprocess.run([sys.executable, str(MAIN), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_every_experiment_config_loads_with_its_variants():
    import importlib.util
    for path in sorted((ROOT / "experiments").glob("*.py")):
        if path.name == "main.py":
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for variant in getattr(module, "VARIANTS", ("default",)):
            config = module.get_config(variant)
            assert "job" in config, f"{path.name}:{variant} has no job"
            from tr.stages import registry
            assert config.job in registry.JOBS, f"{path.name}:{variant} names unknown job {config.job}"


def test_gae_demo_runs_and_shows_tb_gae_invariance(tmp_path):
    result = run_main("--config=experiments/gae_demo.py", f"--workdir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "gae_demo.json").read_text())
    short, long = rows["short logs"], rows["logs x20"]
    assert long["tokens"] > short["tokens"]
    # TB-GAE: same decisions, same values -> same advantages whatever the log length.
    assert short["tb_gae"] == pytest.approx(long["tb_gae"], abs=1e-6)
    # Token GAE over the interleaved chain discounts per token: longer logs, less credit early.
    assert all(l <= s + 1e-6 for l, s in zip(long["token_gae"], short["token_gae"]))
    assert any(l < s for l, s in zip(long["token_gae"], short["token_gae"]))
    # ... while TB-GAE decays by exactly γ_turn·λ_turn per boundary (0.99 · 0.95).
    ratios = [a / b for a, b in zip(short["tb_gae"], short["tb_gae"][1:])]
    assert ratios == pytest.approx([0.99 * 0.95] * 4, rel=1e-5)
    assert (tmp_path / "config.json").is_file()
    assert "tb_gae" in result.stdout


def test_variant_and_override_reach_the_job(tmp_path):
    result = run_main("--config=experiments/gae_demo.py:unit_clock", f"--workdir={tmp_path}",
                      "--config.long_log_repeat=3")
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["gamma_turn"] == 1.0 and config["long_log_repeat"] == 3
    assert "logs x3" in json.loads((tmp_path / "gae_demo.json").read_text())


@pytest.mark.parametrize("args, expected", [
    (["--config=experiments/no_such_file.py"], "no_such_file.py"),
    (["--config=experiments/gae_demo.py:nonsense"], "nonsense"),
    (["--config=experiments/gae_demo.py", "--config.job=nonsense"], "config.job = 'nonsense'"),
])
def test_bad_configs_get_a_clear_error(tmp_path, args, expected):
    result = run_main(*args, f"--workdir={tmp_path}")
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_override_of_a_missing_field_names_it(tmp_path):
    result = run_main("--config=experiments/gae_demo.py", "--config.no_such_field=1",
                      f"--workdir={tmp_path}")
    assert result.returncode == 2
    assert "no_such_field" in result.stderr and "Traceback" not in result.stderr


def test_main_job_evaluates_the_scripted_teacher_end_to_end(tmp_path):
    """The README's main job, cut to three tasks and the teacher: real sandboxes, real verifier."""
    result = run_main("--config=experiments/evaluate.py:quick", "--config.eval.policies=('scripted',)",
                      f"--workdir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "eval.json").read_text())["scripted"]
    assert summary["overall"]["tasks"] == 3
    assert summary["overall"]["pass@1"] == 1.0  # the teacher replays reference solutions
    assert set(summary["by_tier"]) <= {"easy", "medium", "hard", "extreme"}
    assert "Mean@1" in (tmp_path / "eval.txt").read_text()
    assert (tmp_path / "episodes-scripted.jsonl").stat().st_size > 0


def test_main_job_names_an_unknown_task(tmp_path):
    result = run_main("--config=experiments/evaluate.py:quick", "--config.eval.tasks=('no-such-task',)",
                      f"--workdir={tmp_path}")
    assert result.returncode != 0
    assert "no-such-task" in result.stderr and "Traceback" not in result.stderr


SHIPPED_FILLS = """
import importlib.util, json, pathlib, sys
root = pathlib.Path(sys.argv[1])
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
main = load(root / "experiments" / "main.py", "entry")
out = {}
for path in sorted((root / "experiments").glob("*.py")):
    if path.name != "main.py":
        module = load(path, "x_" + path.stem)
        for variant in getattr(module, "VARIANTS", ("default",)):
            config = module.get_config(variant)
            defaults = main.job_defaults(str(config.job))
            out[f"{path.name}:{variant}"] = None if defaults is None else main.fill_defaults(config, defaults)
print(json.dumps(out))
"""


def test_defaults_fill_nothing_in_a_shipped_config():
    """The job defaults a partial config gets never reach a shipped experiment: each variant of
    each config file already has every field of its job's defaults (so their runs are unchanged)."""
    result = subprocess.run([sys.executable, "-c", SHIPPED_FILLS, str(ROOT)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    fills = json.loads(result.stdout.splitlines()[-1])
    assert len(fills) >= 15 and "terminal_rsi.py:quick" in fills and "reterm.py:paper" in fills
    assert {name: f for name, f in fills.items() if f} == {}


def test_a_partial_config_gets_its_jobs_defaults(tmp_path):
    """`job` and the fields it changes (issue 47): the rest comes from the job's default config,
    the given values stay as given, and the stderr line names what was filled."""
    (tmp_path / "partial.py").write_text(
        "import ml_collections\n"
        "def get_config():\n"
        "    return ml_collections.ConfigDict({'job': 'evaluate', 'eval': {\n"
        "        'policies': ('scripted',), 'tasks': ('ft-normalize-whitespace',), 'k': 1}})\n")
    result = run_main(f"--config={tmp_path / 'partial.py'}", f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "from the evaluate job's defaults (experiments/evaluate.py)" in result.stderr
    assert "eval.backend" in result.stderr
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["eval"]["k"] == 1 and config["eval"]["policies"] == ["scripted"]
    assert config["eval"]["backend"] == "local" and config["seed"] == 0 and "pod" in config
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert "scripted" in json.dumps(report)
