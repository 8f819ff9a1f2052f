"""The stage kinds and the loop on real rollouts of gym tasks (`tr.envs.gym`): a tiny
`init -> warmup -> rpr` pipeline (one process), its stage store and metrics; then the same pipeline SIGKILLed in the middle of RPR and
restarted reproduces the uninterrupted run's metrics and parameters exactly, no update lost or
repeated."""

import json
import math
import os
import pathlib
import signal
import time

import pytest

import child_runs
from event_files import assert_same_scalars, expected_scalars, read_scalars

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "loop_child.py"
TIMEOUT_S = 900
NONDETERMINISTIC = ("rollout_s", "generation_s", "cached")


def start(run_dir, env):
    return child_runs.start(CHILD, env, "--run_dir", run_dir, "--source", "gym")


def finish(proc) -> dict:
    return child_runs.done_json(child_runs.finish(proc, TIMEOUT_S))


def metrics(run_dir, stage):
    lines = []
    for text in (pathlib.Path(run_dir) / stage / "metrics.jsonl").read_text().splitlines():
        line = json.loads(text)
        line.pop("seconds", None)       # the iteration's wall seconds per part
        for key in NONDETERMINISTIC:
            line["rollouts"].pop(key, None)
        lines.append(line)
    return lines


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def step_hashes(run_dir, stage):
    out = {}
    for folder in sorted((pathlib.Path(run_dir) / stage / "checkpoints").iterdir()):
        if folder.name.isdigit():
            out[int(folder.name)] = json.loads((folder / "manifest" / "metadata").read_text())["hashes"]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    env = child_runs.child_env(root / "jax_cache")
    summaries = finish(start(root / "ref", env))
    return root, env, summaries


def test_pipeline_runs_warmup_and_rpr_from_base(reference):
    root, _, summaries = reference
    run = root / "ref"
    assert sorted(summaries) == ["base", "rpr-1", "warmup"]
    for stage in summaries:
        assert json.loads((run / stage / "stage.json").read_text())["finished_step"] is not None

    # Warm-up: actor frozen (bitwise), critic trained; EV before/after on every update line.
    base, warmup, rpr = summaries["base"], summaries["warmup"], summaries["rpr-1"]
    assert warmup["actor_hash"] == base["actor_hash"]
    assert warmup["critic_hash"] != base["critic_hash"]
    lines = metrics(run, "warmup")
    assert [line["step"] for line in lines] == list(range(1, warmup["updates"] + 1))
    assert all({"ev_before", "ev_after", "critic/explained_variance"} <= set(line) for line in lines)
    assert len(warmup["ev_per_update"]) == warmup["updates"]

    # RPR: one critic-only calibration update (actor still the parent's), then joint PPO with
    # 2 epochs x 2 mini-batches per rollout batch.
    lines = metrics(run, "rpr-1")
    assert [line["phase"] for line in lines] == ["calibration"] + ["ppo"] * 8
    assert [line["step"] for line in lines] == list(range(1, 10))
    hashes = step_hashes(run, "rpr-1")
    assert hashes[1]["actor_params"] == base["actor_hash"] != hashes[1 + 4]["actor_params"]
    assert hashes[0]["critic_params"] == warmup["critic_hash"] != hashes[1]["critic_params"]
    assert rpr["actor_hash"] == hashes[9]["actor_params"] != base["actor_hash"]
    # Over-sampling N' = 3 -> N = 2 (keep-first), SPR rewards with the profiled, frozen table.
    assert all(line["rollouts"]["launched"] == 3 and line["rollouts"]["kept"] == 2
               for line in lines)
    table = json.loads((run / "rpr-1" / "scales.json").read_text())
    assert all({"D", "D_prime", "rule"} <= set(row) for row in table.values())
    assert rpr["reward"] == "spr" and rpr["scales"].endswith("scales.json")
    # Retained step chosen on val: one of the evaluated steps, recorded in the summary.
    evals = [json.loads(x) for x in (run / "rpr-1" / "eval-val.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 9] and rpr["retained_step"] in (0, 9)
    assert json.loads((run / "rpr-1" / "eval-val.json").read_text())["overall"]["tasks"] == 1
    assert len(list((run / "rpr-1" / "rollouts").glob("*.jsonl"))) == 3
    assert len(list((run / "rpr-1" / "rollouts").glob("*.stats.json"))) == 3
    # TensorBoard event files beside each metrics.jsonl hold the same scalars.
    for stage in ("warmup", "rpr-1"):
        assert_same_scalars(read_scalars(run / stage), expected_scalars(run / stage / "metrics.jsonl"))


def test_sigkill_mid_rpr_then_restart_reproduces_the_uninterrupted_run(reference):
    root, env, want = reference
    run = root / "killed"
    proc = start(run, env)
    marker = run / "rpr-1" / "rollouts" / "00002.jsonl"    # mid-PPO: batch 3's rollouts written
    deadline = time.monotonic() + TIMEOUT_S
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "timed out waiting for the third rollout batch"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.read()
    assert json.loads((run / "rpr-1" / "stage.json").read_text())["finished_step"] is None
    got = finish(start(run, env))
    for stage in ("warmup", "rpr-1"):
        assert got[stage]["actor_hash"] == want[stage]["actor_hash"], stage
        assert got[stage]["critic_hash"] == want[stage]["critic_hash"], stage
        got_lines, want_lines = metrics(run, stage), metrics(root / "ref", stage)
        assert [x["step"] for x in got_lines] == [x["step"] for x in want_lines], stage
        for a, b in zip(got_lines, want_lines):
            assert same(a, b), (stage, a["step"])
        # The killed run's events past its checkpoint are purged: TensorBoard shows each step once,
        # with the resumed run's values.
        assert_same_scalars(read_scalars(run / stage), expected_scalars(run / stage / "metrics.jsonl"))
