"""TensorBoard event files beside metrics.jsonl (tr.stages.scalars through MetricsLog), read back
with TensorBoard's own reader; the run-level progress line (tr.stages.progress)."""

import io
import math
import re

import pytest

from event_files import assert_same_scalars, expected_scalars, read_scalars
from tr.stages import progress, scalars
from tr.stages.metrics import MetricsLog


def line(iteration, step, loss):
    return {"stage": "rpr", "iteration": iteration, "step": step, "phase": "ppo", "actor/loss": loss,
            "rollouts": {"pass_rate": 0.25 * iteration, "count": 8, "cached": False},
            "seconds": {"rollouts": 1.5}, "tags": ["a"], "none": None}


def test_event_files_hold_the_metrics_jsonl_scalars(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", stream=io.StringIO())
    log.write([line(0, 1, 0.5), line(0, 2, float("nan"))])
    log.write([line(1, 3, -1.25)])
    log.close()
    got = read_scalars(tmp_path)
    assert got["actor/loss"][1] == 0.5 and math.isnan(got["actor/loss"][2])
    assert got["rollouts/pass_rate"] == {1: 0.0, 2: 0.0, 3: 0.25}
    assert "rollouts/cached" not in got and "stage" not in got and "step" not in got
    assert_same_scalars(got, expected_scalars(tmp_path / "metrics.jsonl"))


def test_a_resumed_stage_replaces_the_steps_it_dropped(tmp_path):
    first = MetricsLog(tmp_path / "metrics.jsonl", stream=io.StringIO())
    first.write([line(0, 1, 1.0), line(1, 2, 2.0), line(2, 3, 3.0)])   # killed before saving it 2
    # (no close: a killed run closes nothing, so each write must already be on disk)
    resumed = MetricsLog(tmp_path / "metrics.jsonl", stream=io.StringIO())
    resumed.truncate(2)
    resumed.write([line(2, 3, 30.0), line(3, 4, 40.0)])
    resumed.close()
    got = read_scalars(tmp_path)
    assert got["actor/loss"] == {1: 1.0, 2: 2.0, 3: 30.0, 4: 40.0}
    assert_same_scalars(got, expected_scalars(tmp_path / "metrics.jsonl"))


def test_a_killed_run_loses_no_line_it_logged(tmp_path):
    """Resumed past its last line (nothing dropped): the killed writer's events, never closed,
    are all on disk, and the new file continues them."""
    first = MetricsLog(tmp_path / "metrics.jsonl", stream=io.StringIO())
    first.write([line(0, 1, 1.0)])
    first.write([line(1, s, float(s)) for s in range(2, 6)])
    resumed = MetricsLog(tmp_path / "metrics.jsonl", stream=io.StringIO())
    resumed.truncate(2)
    resumed.write([line(2, s, float(s)) for s in range(6, 10)])
    got = read_scalars(tmp_path)
    assert got["actor/loss"] == {s: float(s) for s in range(1, 10)}
    assert_same_scalars(got, expected_scalars(tmp_path / "metrics.jsonl"))


def test_scalar_writer_needs_an_integer_step(tmp_path):
    with pytest.raises(ValueError, match=r"integer 'step', got None"):
        scalars.ScalarWriter(tmp_path).write([{"loss": 1.0}])


def test_wandb_is_optional_and_named_when_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(scalars.WANDB_PROJECT_ENV, raising=False)
    scalars.ScalarWriter(tmp_path / "a").write([{"step": 1, "x": 1.0}])      # no W&B touched
    try:
        import wandb  # noqa: F401
        pytest.skip("wandb is installed here")
    except ImportError:
        pass
    monkeypatch.setenv(scalars.WANDB_PROJECT_ENV, "proj")
    with pytest.raises(RuntimeError, match="TR_WANDB_PROJECT is set but the 'wandb' package"):
        scalars.ScalarWriter(tmp_path / "b").write([{"step": 1, "x": 1.0}])


def test_progress_line_has_the_stage_and_an_eta(tmp_path):
    out, log_stream = io.StringIO(), io.StringIO()
    log = MetricsLog(tmp_path / "metrics.jsonl", stream=log_stream)
    with progress.stage(1, 4, "rpr1", "ppo", stream=out):
        log.t0 -= 20.0                        # 20 s into the stage,
        log.start = 2                         # resumed after 2 iterations: 2 more done here
        log.progress("rpr1 it 4/10", done=4, total=10)
    text = log_stream.getvalue()
    assert text.count("\n") == 1 and "\r" not in text
    assert re.search(r"\[stage 2/4 rpr1\] rpr1 it 4/10  4/10 \[00:20<01:00, 10\.0\d?s/it\]", text), text
    start, done = out.getvalue().splitlines()
    assert start == "[stage 2/4 rpr1] start (ppo)" and done.startswith("[stage 2/4 rpr1] done in ")
    assert progress.label() == ""
