"""The ReTerm experiment (tr/stages/reterm.py, experiments/reterm.py): the quick variant end to end
through experiments/main.py (real sandboxes, real SFT and GRPO updates, the real queue), the
report's keys and consistency, the paper variant's validation, config errors named."""

import json
import os
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from tr.stages import reterm
from tr.stages.registry import ConfigError, resolve, stage_kind

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments import reterm as reterm_config  # noqa: E402


def test_quick_runs_end_to_end(tmp_path):
    state = tmp_path / "sandbox-state"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TR_GYM_DIR": str(tmp_path / "gym"),
           "TR_SANDBOX_STATE_DIR": str(state)}
    proc = subprocess.run([sys.executable, "experiments/main.py",
                           "--config=experiments/reterm.py:quick", f"--workdir={tmp_path / 'run'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_quick_run(tmp_path / "run", state)
    # killed after update 1 of reterm_grpo: the rerun skips the finished stages and resumes it
    arms = json.loads((tmp_path / "run" / "arms.json").read_text())
    before = simulate_kill(tmp_path / "run", "reterm_grpo", keep_step=1)
    proc = subprocess.run(proc.args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_resumed(tmp_path / "run", state, before)
    # the finished arms, evaluated again in the new process after other work (no stage re-run),
    # give the same episodes: an evaluation's samples depend on its seed only
    again = json.loads((tmp_path / "run" / "arms.json").read_text())
    for arm in ("base", "sft", "grpo"):
        assert again[arm] == arms[arm], arm


def simulate_kill(run: pathlib.Path, stage: str, *, keep_step: int) -> dict:
    """The state a SIGKILL after checkpoint `keep_step` leaves: later checkpoints, summary.json and
    the manifest's finished mark gone.  Returns the other stages' summaries (must not change)."""
    import shutil

    for step_dir in (run / stage / "checkpoints").iterdir():
        if int(step_dir.name) > keep_step:
            shutil.rmtree(step_dir)
    (run / stage / "summary.json").unlink()
    manifest = json.loads((run / stage / "stage.json").read_text())
    manifest["finished_step"] = None
    manifest.pop("actor_hash_after", None)
    (run / stage / "stage.json").write_text(json.dumps(manifest))
    return {s: (run / s / "summary.json").read_text() for s in ("sft", "grpo")}


def check_resumed(run: pathlib.Path, state: pathlib.Path, before: dict) -> None:
    for s, text in before.items():
        assert (run / s / "summary.json").read_text() == text          # not re-run
    lines = [json.loads(x) for x in (run / "reterm_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]                          # update 2 made once
    assert lines[1]["recovery_groups"] == 0          # the queue is empty after a resume
    summary = json.loads((run / "reterm_grpo" / "summary.json").read_text())
    assert summary["retained_step"] == 2 and summary["finished_step"] == 2
    # the counts of recovery groups span the update made before the kill and the one after
    assert summary["recovery_groups"] == {
        "sampled": sum(x["recovery_groups"] for x in lines),
        "with_signal": sum(x["recovery_groups_with_signal"] for x in lines)}
    assert json.loads((run / "report.json").read_text())["stages"]["reterm_grpo"] == summary
    assert not list(state.glob("snapshots/*"))


def check_quick_run(run: pathlib.Path, state: pathlib.Path) -> None:
    """The quick run's outputs (also usable on a run made by hand with the same command)."""
    report = json.loads((run / "report.json").read_text())
    assert report["experiment"] == "reterm" and report["variant"] == "quick"
    assert report["seed"] == 0 and report["wall_s"] > 0
    machine = report["machine"]   # runs compare only within one kind of machine
    assert machine["cores"] >= 1 and machine["cpu"] and machine["backend"] == "cpu" and machine["jax"]
    assert set(report["arms"]) == {"base", "sft", "grpo", "reterm_grpo"}
    for arm in report["arms"].values():
        assert 0.0 <= arm["pass_at_1"] <= 1.0 and 1 <= arm["episodes"] <= 3
        assert 0.0 <= arm["recovery_at_k"] <= 1.0 and arm["k"] == 1
        assert arm["mean_turns"] >= 1
    d = report["dataset"]
    assert set(d["rejected_by"]) == {"verifier", "format", "compliance", "efficiency"}
    assert d["kept"] + sum(d["rejected_by"].values()) == d["recoveries"] == d["failures"]
    q = report["queue"]
    assert q["capacity"] == 16 and q["inserted"] >= 0 and q["evicted"] == max(0, q["inserted"] - 16)
    shards = sorted((run / "sft" / "data").glob("recoveries-*.jsonl"))
    rows = [json.loads(line) for p in shards for line in p.read_text().splitlines()]
    assert len(rows) == d["kept"]
    for row in rows:
        assert sum(row["loss_mask"]) > 0 and len(row["tokens"]) == len(row["loss_mask"])
        assert row["history_turns"] == 1 and row["h_f"][0]["content"] == row["x"]
    # recoveries saw the task and the last turn of h_f; the SFT mixed plain demos 1:1
    sft = report["stages"]["sft"]
    assert report["config"]["history_turns"] == 1 and report["config"]["plain_share"] == 0.5
    assert sft["rows"] == sft["recovery_rows"] + sft["plain_rows"] and sft["plain_share"] == 0.5
    assert sft["plain_rows"] == reterm.plain_count(sft["recovery_rows"], 0.5) >= 1
    assert (run / "report.md").read_text().startswith("# ReTerm (quick")
    assert (run / "reward_curves.png").stat().st_size > 1000
    for stage in ("grpo", "reterm_grpo"):
        assert (run / stage / "metrics.jsonl").read_text().count("\n") == 2
    # every stage is a finished stage of the store: manifest (model, tokenizer, system prompt
    # handed down from base), summary.json with the step retained on val
    base_manifest = json.loads((run / "base" / "stage.json").read_text())
    for stage, parent in (("sft", "base"), ("grpo", "sft"), ("reterm_grpo", "sft")):
        manifest = json.loads((run / stage / "stage.json").read_text())
        summary = json.loads((run / stage / "summary.json").read_text())
        assert manifest["finished_step"] is not None and manifest["parents"]["actor"]["stage"] == parent
        for field in ("model", "tokenizer", "system_prompt"):
            assert manifest["config"][field] == base_manifest["config"][field]
        assert summary["retained_step"] == manifest["finished_step"]
        assert summary["val"] and summary["val"][-1]["step"] == summary["retained_step"]
    assert json.loads((run / "stages.json").read_text())[1]["kind"] == "reterm_sft"
    # the teacher recovers from real failure states; the second ReTerm update has recovery groups
    assert d["kept"] >= 1 and report["stages"]["sft"]["rows"] >= 1
    curve = report["curves"]["reterm_grpo"]
    assert curve[1]["recovery_groups"] == min(1, q["inserted"]) and q["sampled"] == curve[1]["recovery_groups"]
    # issue 46: the recovery groups trained on, and those with reward variance (a GRPO gradient);
    # with one recovery group per update, it has variance iff its pass rate is strictly inside (0, 1)
    groups = report["recovery_groups"]
    assert groups["sampled"] == sum(line["recovery_groups"] for line in curve) == q["sampled"]
    for line in curve:
        inside = line["recovery_reward"] is not None and 0 < line["recovery_reward"] < 1
        assert line["recovery_groups_with_signal"] == int(line["recovery_groups"] == 1 and inside)
    assert groups["with_signal"] == sum(line["recovery_groups_with_signal"] for line in curve)
    assert f"{groups['sampled']} recovery groups trained on" in (run / "report.md").read_text()
    # nothing leaked: every persisted snapshot of the run was discarded
    assert state.is_dir() and not list(state.glob("snapshots/*"))


def test_paper_variant_validates_only(tmp_path):
    cfg = reterm_config.get_config("paper")
    assert (cfg.grpo.m_original, cfg.grpo.m_recovery, cfg.grpo.group_size) == (8, 2, 16)
    assert cfg.sft.batch == 16 and cfg.sft.learning_rate == 5e-6 and cfg.grpo.learning_rate == 5e-7
    assert cfg.eval.temperature == 1.0 and cfg.seed == 0 and cfg.eval.max_turns == 32
    out = reterm.run(cfg, tmp_path)
    assert out["validated"] and out["grpo_batch"] == 160
    cfg.grpo.batch = 150
    with pytest.raises(ConfigError, match="config.grpo.batch = 150"):
        reterm.run(cfg, tmp_path)


def test_bad_config_values_are_named(tmp_path):
    for path, value, match in (("grpo.group_weighting", "mean", "group_weighting = 'mean'"),
                               ("queue.sampling", "lifo", "queue.sampling = 'lifo'"),
                               ("queue.capacity", 0, "config.queue.capacity must be >= 1"),
                               ("recovery.history_turns", -1,
                                "config.recovery.history_turns must be >= 0"),
                               ("sft.plain_share", 1.0,
                                r"config.sft.plain_share must be in \[0, 1\)")):
        cfg = reterm_config.get_config("quick")
        section, field = path.split(".")
        cfg[section][field] = value
        with pytest.raises(ConfigError, match=match):
            reterm.run(cfg, tmp_path)
    cfg = reterm_config.get_config("queue")
    assert len(cfg.queue.sweep) == 6
    cfg.queue.sweep = ((4, "front"), (0, "front"))
    with pytest.raises(ConfigError, match=r"config.queue.sweep\[1\] = \(0, 'front'\)"):
        reterm.run(cfg, tmp_path)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        reterm_config.get_config("nope")


def test_job_and_stage_kinds_are_registered():
    assert resolve("reterm") is reterm.run
    assert stage_kind("reterm_sft") is reterm.run_sft
    assert stage_kind("grpo") is reterm.run_grpo
    assert stage_kind("reterm_grpo") is reterm.run_reterm_grpo
    assert isinstance(reterm_config.get_config("queue").queue, ml_collections.ConfigDict)


def test_stage_config_errors_are_named(tmp_path):
    cases = (({"name": "g", "kind": "grpo"}, reterm.run_grpo, "needs actor_from"),
             ({"name": "g", "kind": "grpo", "actor_from": "sft", "critic_from": "fresh"},
              reterm.run_grpo, "trains no critic"),
             ({"name": "g", "kind": "grpo", "actor_from": "sft", "grpo": {"updates": 0}},
              reterm.run_grpo, "grpo.updates must be >= 1"),
             ({"name": "r", "kind": "reterm_grpo", "actor_from": "sft",
               "queue": {"sampling": "lifo"}}, reterm.run_reterm_grpo, "queue.sampling = 'lifo'"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base", "nope": 1},
              reterm.run_sft, "unknown config field"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base",
               "teacher": {"kind": "oracle"}}, reterm.run_sft, "teacher.kind = 'oracle'"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base",
               "teacher": {"thoughts": "verbose"}}, reterm.run_sft,
              "teacher.thoughts = 'verbose'"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base",
               "recovery": {"history_turns": -1}}, reterm.run_sft,
              "recovery.history_turns must be >= 0"),
             ({"name": "r", "kind": "reterm_grpo", "actor_from": "sft",
               "recovery": {"history_turns": -2}}, reterm.run_reterm_grpo,
              "recovery.history_turns must be >= 0"),
             ({"name": "g", "kind": "grpo", "actor_from": "sft",
               "recovery": {"history_turns": 1}}, reterm.run_grpo, "unknown config field"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base",
               "sft": {"plain_share": 1.0}}, reterm.run_sft,
              r"sft.plain_share must be in \[0, 1\)"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base",
               "sft": {"plain_share": -0.1}}, reterm.run_sft, "sft.plain_share must be in"),
             ({"name": "s", "kind": "reterm_sft", "actor_from": "base"}, reterm.run_sft,
              "stage 'base' named as a parent has no manifest"))
    for entry, fn, match in cases:
        with pytest.raises(ConfigError, match=match):
            fn(entry, tmp_path)
    assert not list(tmp_path.iterdir())     # nothing written for a refused stage


def test_recovery_settings_reach_the_stages():
    """recovery.history_turns goes to every stage that runs recoveries (the SFT data, ReTerm-GRPO
    and the queue sweep's stages), sft.plain_share to the SFT stage; the paper keeps the full
    history and recovery rows only."""
    for variant, turns, share in (("default", 1, 0.5), ("queue", 1, 0.5), ("paper", 0, 0.0)):
        cfg = reterm_config.get_config(variant)
        entries = reterm.stage_entries(cfg)
        for e in entries[1:]:
            config = reterm.resolve(e, e["kind"])
            if e["kind"] == "grpo":
                assert "recovery" not in e and "recovery" not in config
            else:
                assert config.recovery.history_turns == turns, (variant, e["name"])
        assert reterm.resolve(entries[1], "reterm_sft").sft.plain_share == share
    assert reterm.defaults("reterm_sft").recovery.history_turns == reterm.HISTORY_TURNS
    assert [reterm.plain_count(n, s) for n, s in ((107, 0.5), (9, 0.25), (10, 0.0), (3, 0.9))] == \
        [107, 3, 0, 27]


def test_plain_rows_mix_the_stated_share(tmp_path, monkeypatch):
    """The SFT stage's plain rows: the Base's scripted demos of fresh `train` instances (real
    sandboxes), clean or mistake-then-repair, each within sft.length, loss on the teacher's
    actions only; with the recovery rows they make the stated share."""
    from tr.envs import gym
    from tr.models import embedded

    monkeypatch.setenv("TR_GYM_DIR", str(tmp_path / "gym"))
    tok = embedded.load_tokenizer()
    config = reterm.resolve({"name": "s", "kind": "reterm_sft", "actor_from": "base",
                             "concurrency": 4, "sft": {"plain_share": 0.25}}, "reterm_sft")
    n_recovery = 9
    n = reterm.plain_count(n_recovery, config.sft.plain_share)
    seqs, stats = reterm.plain_rows(config, tok, embedded.SYSTEM_PROMPT, n)
    assert len(seqs) == n == 3 and stats["sequences"] == 3 and stats["dropped"] == 0
    assert len(seqs) / (len(seqs) + n_recovery) == 0.25
    assert set(stats["kinds"]) <= {"clean", "mistake"} and stats["passed"] == 3
    fresh = [t.instruction for t in gym.split_tasks("train", n, seed=1)]
    for s in seqs:
        assert 0 < len(s["tokens"]) <= config.sft.length
        assert s["loss_mask"].any() and not (s["loss_mask"] & ~s["actor_mask"]).any()
        text = tok.decode(s["tokens"])
        assert any(x in text for x in fresh) and "previous attempt failed" not in text
    config.sft.length = 64                  # no demo fits: all dropped, counted
    seqs, stats = reterm.plain_rows(config, tok, embedded.SYSTEM_PROMPT, 2)
    assert seqs == [] and stats["dropped"] == 2
    assert reterm.plain_rows(config, tok, embedded.SYSTEM_PROMPT, 0)[0] == []


def test_sigterm_discards_the_persisted_snapshots(tmp_path):
    """A run killed with SIGTERM while it holds failure snapshots exits 143 and leaves none in the
    sandbox state folder (experiments/main.py turns SIGTERM into SystemExit: `finally` blocks run)."""
    import signal
    import time

    state = tmp_path / "sandbox-state"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TR_GYM_DIR": str(tmp_path / "gym"),
           "TR_SANDBOX_STATE_DIR": str(state)}
    proc = subprocess.Popen([sys.executable, "experiments/main.py",
                             "--config=experiments/reterm.py:quick", f"--workdir={tmp_path / 'run'}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 900
        while not list(state.glob("snapshots/*")):
            assert proc.poll() is None, f"the run ended before it held a snapshot: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no snapshot was persisted within 900 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not list(state.glob("snapshots/*"))


def test_a_policy_samples_by_its_seed_not_by_what_ran_before():
    """An arm's evaluation samples the same tokens and log-probs whatever the process did before
    (earlier policies, a fresh process): the policy seed is the one asked for. (A count of earlier
    policies in the seed made a resumed run or a lone re-evaluation sample other tokens.)"""
    from flax import nnx

    from tr.agent.harness import GenerationRequest
    from tr.models.decoder import Decoder
    from tr.models import embedded

    model = embedded.load_init(Decoder(embedded.model_config(), rngs=nnx.Rngs(0)), embedded.INIT)
    tokenizer = embedded.load_tokenizer()
    prompt = tuple(tokenizer.encode(embedded.SYSTEM_PROMPT + "\nCreate /app/out.txt holding 42."))
    request = GenerationRequest(messages=(), prompt_tokens=prompt, max_tokens=24,
                                episode_id="eval-sft-0", seed=3)

    def evaluate(actor):
        policy = actor.policy(temperature=1.0, top_p=1.0, seed=0, name="sft")   # the init: flat enough
        g = policy.submit(request).result(timeout=600)
        policy.end_episode(request.episode_id)
        return g.tokens, g.logprobs, policy.seed

    first = reterm.Actor(model, tokenizer, concurrency=4, max_output_tokens=24)
    try:
        before = evaluate(first)
        for step in range(3):   # other work in the process: val evaluations, rollouts
            first.policy(temperature=1.0, top_p=1.0, seed=step, name="val")
        after = evaluate(first)
    finally:
        first.sampler.close()
    fresh = reterm.Actor(model, tokenizer, concurrency=4, max_output_tokens=24)
    try:
        again = evaluate(fresh)
    finally:
        fresh.sampler.close()
    assert before[:2] == after[:2] == again[:2]     # the samples (old: other tokens after other work)
    assert before[2] == after[2] == again[2] == 0


def _rollout(group: str, index: int, passed: bool, kind: str = "original"):
    from tr.agent.records import EpisodeRecord, EpisodeStatus, Segment

    segs = [Segment("prompt", [10, 11], turn=0),
            Segment("action", [20 + index, 21], turn=1, source="policy", logprobs=[-0.5, -0.25])]
    return EpisodeRecord(episode_id=f"{group}-{index}", task_id=group, group_id=group,
                         rollout_index=index, kind=kind, passed=passed, segments=segs,
                         status=EpisodeStatus.VERIFIED_PASS if passed else EpisodeStatus.VERIFIED_FAIL)


def test_a_short_group_is_dropped_so_later_groups_keep_their_rows():
    """A group that lost a rollout (cancelled) would shift every later group by one row against
    `grpo_update`'s `row // group_size`; it is dropped, and each kept group's rows get the GRPO
    advantages of its own rewards (numpy reference, per group)."""
    import numpy as np

    from tr.rl.advantages import grpo_row_advantages

    size = 4
    passes = {"a": [1, 0, 1], "b": [1, 0, 0, 0], "c": [0, 1, 1, 1]}      # "a" lost a rollout
    groups = [("original", [_rollout(g, i, bool(p)) for i, p in enumerate(ps)])
              for g, ps in passes.items()]
    batch, kept, dropped = reterm.group_rows(groups, length=8, group_size=size, rows=3 * size)
    assert dropped == 1 and [recs[0].group_id for _, recs in kept] == ["b", "c"]
    row_rewards = batch["rewards"].sum(axis=1)
    np.testing.assert_array_equal(row_rewards[:8], [1, 0, 0, 0, 0, 1, 1, 1])
    adv = np.asarray(grpo_row_advantages(batch["rewards"], batch["actor_mask"], group_size=size))
    for k, ps in enumerate((passes["b"], passes["c"])):
        r = np.asarray(ps, np.float64)
        expected = (r - r.mean()) / (r.std() + 1e-6)
        for j in range(size):
            row = k * size + j
            got = adv[row][batch["actor_mask"][row]]
            np.testing.assert_allclose(got, expected[j], rtol=1e-5)
    assert not batch["actor_mask"][8:].any()          # padding rows: no group, no loss
