"""The RL learning benchmark's quick form (bench/rl_learning.py --quick): a real quick Base made in
the run directory, real sandboxed rollouts, two real GRPO updates; the curve JSON and the plot are
written and sane (this is not a check that it learns: the benchmark, run by hand, is)."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quick_benchmark_writes_a_sane_curve_and_plot(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TR_GYM_DIR": str(tmp_path / "gym"),
           "TR_SANDBOX_STATE_DIR": str(tmp_path / "sandbox-state")}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/rl_learning.py", f"--run={tmp_path / 'run'}", f"--workdir={out}",
         "--quick", "--aggregation=sequence_mean", "--dynamic_sampling", "--oversample=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "curve.json").read_text())
    assert result["families"] == ["copy-keep"]
    assert [c["batch"] for c in result["curve"]] == [1, 2]
    for c in result["curve"]:
        # 2 tasks + 1 oversampled, 2 rollouts each: every episode counted in the pass rate
        assert c["episodes"] == 6
        assert 0.0 <= c["pass"] <= 1.0 and 0.0 <= c["pass_family_balanced"] <= 1.0
        assert c["pass"] == c["pass_family_balanced"]          # one family: the same number
        assert c["groups_kept"] + c["groups_dropped"] <= 2
        assert 0 <= c["groups_dropped_uniform"] <= c["groups_uniform"] <= 3
        assert c["wall_s"] > 0
    for split in ("val", "test"):
        for when in ("before", "after"):
            ev = result[when][split]
            assert ev["episodes"] == 2 and 0.0 <= ev["pass@1"] <= 1.0
    assert result["args"]["aggregation"] == "sequence_mean"
    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert "batch   1: pass" in proc.stdout and "after:  val" in proc.stdout


def test_bad_family_is_named(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/rl_learning.py", f"--run={tmp_path}", f"--workdir={tmp_path}",
         "--families=copy-keep,nope"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "--families='copy-keep,nope': ['nope'] not among the training families" in proc.stderr
