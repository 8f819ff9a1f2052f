"""Stage kind `rsr` on real rollouts of gym tasks in local sandboxes (tests/rsr_child.py): a small
parent with the gym's BPE tokenizer that solves some of its train tasks, then `rsr-1`: explore,
plan, review, replay, SFT on the plain prompt, critic untouched; then the same stage SIGKILLed in
the middle of its SFT and restarted reproduces the uninterrupted run exactly."""

import json
import os
import pathlib
import shutil
import signal
import time

import pytest

import child_runs

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "rsr_child.py"
TIMEOUT_S = 1500
NONDETERMINISTIC = ("rollout_s", "generation_s", "cached", "wall_s", "explore_s", "plan_s",
                    "replay_s", "sft_s")


def start(run_dir, env):
    return child_runs.start(CHILD, env, "--run_dir", run_dir)


def finish(proc) -> dict:
    return child_runs.done_json(child_runs.finish(proc, TIMEOUT_S))


def deterministic(summary: dict) -> dict:
    out = {k: v for k, v in summary.items() if k not in NONDETERMINISTIC}
    for key in ("explore_rollouts", "replay_rollouts"):
        out[key] = {k: v for k, v in out.get(key, {}).items() if k not in NONDETERMINISTIC}
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("rsr")
    env = child_runs.child_env(root / "jax_cache")
    summaries = finish(start(root / "ref", env))
    return root, env, summaries


def test_rsr_rewrites_successes_and_trains_on_plain_prompts(reference):
    root, _, summaries = reference
    run = root / "ref"
    rsr = summaries["rsr-1"]
    base = json.loads((run / "base" / "summary.json").read_text())
    manifest = json.loads((run / "rsr-1" / "stage.json").read_text())
    assert manifest["kind"] == "rsr" and manifest["finished_step"] == rsr["updates"]
    # Hand-off: the parent's BPE tokenizer and system prompt, recorded.
    assert manifest["config"]["tokenizer"] == "tr/models/assets/gym_tokenizer.json"
    prompt = manifest["config"]["system_prompt"]
    assert prompt.startswith("Shell agent in /app.")

    # Explore: K = 2 rollouts of 4 tasks; the parent solves some; every success gets a runbook.
    explored = child_runs.records(run / "rsr-1" / "explore.jsonl")
    assert len(explored) == rsr["explored"] == 8
    successes = [r for r in explored if r["passed"]]
    assert len(successes) == rsr["successes"] > 0
    entries = child_runs.records(run / "rsr-1" / "runbooks.jsonl")
    assert [e["episode_id"] for e in entries] == [r["episode_id"] for r in successes]
    assert all(e["planner"] == "command-list" and e["reviewer"] == "leak-rules" for e in entries)
    assert rsr["runbooks_accepted"] == sum(e["accept"] for e in entries) > 0

    # Replay: each distinct accepted runbook M = 2 times, the runbook in the task prompt.
    replays = child_runs.records(run / "rsr-1" / "replays.jsonl")
    assert len(replays) == 2 * rsr["replayed_runbooks"] == rsr["replays"]
    for r in replays:
        task_id, j = r["task_id"].rsplit("@rb", 1)
        assert r["messages"][0]["content"] == prompt
        assert "Runbook (steps that solved this task before):" in r["messages"][1]["content"]
    assert rsr["accepted_replays"] == sum(bool(r["passed"]) for r in replays) - rsr["replay_leaks"]
    dataset = json.loads((run / "rsr-1" / "dataset.json").read_text())
    assert dataset["q_clean"] == min(dataset["accepted_replays"], dataset["q_clean"])
    assert dataset["q_clean"] == dataset["q_clean_tasks"]                # per_task = 1
    accepted_ids = {r["episode_id"] for r in replays if r["passed"]}
    assert set(dataset["q_clean_episodes"]) <= accepted_ids

    # SFT: epochs x ceil(sequences / batch) updates, metrics per update, val at 0 and the end.
    assert rsr["updates"] == 2 * -(-dataset["sequences"] // 2) > 0
    lines = child_runs.records(run / "rsr-1" / "metrics.jsonl")
    assert [x["step"] for x in lines] == list(range(1, rsr["updates"] + 1))
    assert all(x["phase"] == "sft" and x["loss_tokens"] > 0 for x in lines)
    evals = child_runs.records(run / "rsr-1" / "eval-val.jsonl")
    assert [e["step"] for e in evals] == [0, rsr["updates"]]
    assert rsr["retained_step"] in (0, rsr["updates"])
    assert rsr["actor_hash"] != base["actor_hash"]

    # The critic passed through untouched: Δφ|RSR = 0 (the stage store's hash check).
    assert manifest["critic_frozen"] is True
    assert manifest["critic_hash_before"] == manifest["critic_hash_after"] == base["critic_hash"]
    assert rsr["critic_hash"] == base["critic_hash"]


def test_sigkill_mid_sft_then_restart_reproduces_the_uninterrupted_run(reference):
    root, env, want = reference
    run = root / "killed"
    run.mkdir()
    shutil.copytree(root / "ref" / "base", run / "base")
    proc = start(run, env)
    marker = run / "rsr-1" / "metrics.jsonl"          # the first SFT update is written
    deadline = time.monotonic() + TIMEOUT_S
    while not (marker.exists() and marker.read_text().strip()):
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "timed out waiting for the first SFT update"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.read()
    assert json.loads((run / "rsr-1" / "stage.json").read_text())["finished_step"] is None
    got = finish(start(run, env))
    assert deterministic(got["rsr-1"]) == deterministic(want["rsr-1"])
    strip = lambda lines: [{k: v for k, v in x.items()} for x in lines]  # noqa: E731
    assert strip(child_runs.records(run / "rsr-1" / "metrics.jsonl")) == strip(
        child_runs.records(root / "ref" / "rsr-1" / "metrics.jsonl"))


def _replay(episode_id: str, task_id: str, family: str):
    from tr.agent.records import EpisodeRecord, EpisodeStatus

    return EpisodeRecord(episode_id=episode_id, task_id=task_id, family=family,
                         status=EpisodeStatus.VERIFIED_PASS, passed=True)


def test_sample_clean_caps_each_task_then_each_family():
    from tr.stages.rsr import sample_clean

    # family a: 6 tasks x 3 accepted replays; family b: 1 task x 1 replay
    accepted = [_replay(f"r-a{t}-{i}", f"a{t}@rb0", "a") for t in range(6) for i in range(3)]
    accepted.append(_replay("r-b0-0", "b0@rb0", "b"))
    by_id = {r.task_id: r.task_id.split("@")[0] for r in accepted}
    uncapped = sample_clean(accepted, by_id, per_task=2, seed=3)
    assert len(uncapped) == 6 * 2 + 1
    counts = {}
    for r in uncapped:
        counts[by_id[r.task_id]] = counts.get(by_id[r.task_id], 0) + 1
    assert max(counts.values()) == 2
    capped = sample_clean(accepted, by_id, per_task=2, seed=3, per_family=4)
    families = [r.family for r in capped]
    assert families.count("a") == 4 and families.count("b") == 1
    assert {r.episode_id for r in capped} <= {r.episode_id for r in uncapped}
    # a pure function of (replays, seed): the order the replays finished in does not matter
    again = sample_clean(list(reversed(accepted)), by_id, per_task=2, seed=3, per_family=4)
    assert [r.episode_id for r in again] == [r.episode_id for r in capped]
    assert [r.episode_id for r in sample_clean(accepted, by_id, 2, 3, per_family=0)] == \
        [r.episode_id for r in uncapped]


def test_explore_sampling_defaults_to_the_rollouts_and_bad_values_name_the_field():
    from tr.stages import rsr
    from tr.stages.registry import ConfigError

    config = rsr.defaults()
    config.name = "rsr-x"
    config.rollout.temperature, config.rollout.top_p = 1.0, 1.0
    assert rsr.explore_sampling(config) == {"temperature": 1.0, "top_p": 1.0}
    config.rsr.temperature, config.rsr.top_p = 0.6, 0.95
    assert rsr.explore_sampling(config) == {"temperature": 0.6, "top_p": 0.95}
    rsr.check_config(config)
    for field, value in (("temperature", -0.1), ("top_p", 1.5), ("per_family", -1)):
        bad = rsr.defaults()
        bad.name = "rsr-x"
        bad.rsr[field] = value
        with pytest.raises(ConfigError, match=f"rsr.{field}"):
            rsr.check_config(bad)
