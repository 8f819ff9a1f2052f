"""The rollout engine over real bubblewrap sandboxes: batching across episodes, groups,
over-sampling with cancellation that leaks nothing, recovery rollouts from snapshots."""

import dataclasses
import os
import tempfile
import threading

import pytest

from tr.agent.harness import RECOVERY_PROMPT, Budgets, EpisodeSpec, format_action
from tr.agent.policies import ScriptedPolicy
from tr.agent.records import EpisodeStatus, episode_to_sequences
from tr.agent.rollout import (
    RolloutConfig, TaskEnv, discard_snapshot_ref, group_specs, recovery_specs, run_rollouts,
)
from tr.agent.transcript import ChatLayout, Generation


@pytest.fixture(scope="module")
def tasks():
    from tr.envs.tasks import load_suite

    suite = sorted(load_suite(), key=lambda t: (t.tier != "easy", t.id))
    return suite[:3]


@pytest.fixture(scope="module")
def layout():
    from tr.models.tokenizer import ByteTokenizer

    return ChatLayout(ByteTokenizer())


def _descendants() -> set[int]:
    """Live processes below this one (threads excluded)."""
    me, children, kids = os.getpid(), {}, set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(pid))
        except OSError:
            continue
    stack = [me]
    while stack:
        for c in children.get(stack.pop(), []):
            kids.add(c)
            stack.append(c)
    return kids


class RecordingPolicy(ScriptedPolicy):
    """The scripted policy, recording which episodes each batch held."""

    def __init__(self, tasks, **kw):
        super().__init__(tasks, **kw)
        self.batches = []
        self.lock = threading.Lock()

    def generate(self, requests):
        with self.lock:
            self.batches.append([r.episode_id for r in requests])
        return super().generate(requests)


def test_groups_run_concurrently_and_generation_is_batched(tasks, layout):
    policy = RecordingPolicy(tasks[:2])
    specs = group_specs(tasks[:2], group_size=2, seed=7)
    assert len({s.group_id for s in specs}) == 2
    cfg = RolloutConfig(concurrency=4, batch_window_s=2.0, progress=False)
    out = run_rollouts(specs, policy, layout, cfg)
    assert sorted(r.episode_id for r in out.records) == sorted(s.episode_id for s in specs)
    assert all(r.status is EpisodeStatus.VERIFIED_PASS for r in out.records), [r.error for r in out.records]
    assert max(len(b) for b in policy.batches) >= 2  # several episodes in one sampler call
    assert all(len(set(b)) == len(b) for b in policy.batches)  # one request per episode per batch
    assert sum(len(b) for b in policy.batches) == sum(len(r.turns) for r in out.records)


class SlowForOdd(ScriptedPolicy):
    """Even rollouts play the solution; odd rollouts keep sleeping (the long tail)."""

    def generate(self, requests):
        out = []
        for r in requests:
            if r.seed % 2:
                out.append(Generation(text=format_action("wait", "sleep 2")))
            else:
                out.extend(super().generate([r]))
        return out


def test_oversampling_keeps_first_n_and_cancels_the_rest_without_leaks(tasks, layout, tmp_path, monkeypatch):
    from tr.envs.sandbox import SandboxConfig

    task = tasks[0]
    state, tmp = tmp_path / "state", tmp_path / "tmp"
    state.mkdir(), tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the verifier's scratch dirs land here
    before_procs = _descendants()
    env = TaskEnv("local", SandboxConfig(state_dir=str(state)))
    specs = group_specs([task], group_size=6)  # seeds 0..5: three fast, three slow
    cfg = RolloutConfig(concurrency=6, progress=False, budgets=Budgets(max_turns=50),
                        snapshot_before_verify=True)
    out = run_rollouts(specs, SlowForOdd([task]), layout, cfg, keep_first=3, env=env)
    try:
        assert len(out.records) == 3
        assert sorted(r.seed % 2 for r in out.records) == [0, 0, 0]
        assert all(r.status is EpisodeStatus.VERIFIED_PASS for r in out.records)
        assert len(out.cancelled) + out.not_started == 3
        assert all(r.status is EpisodeStatus.CANCELLED for r in out.cancelled)
        assert env.open_sandboxes == set()
        assert _descendants() - before_procs == set()
        assert list(tmp.iterdir()) == []
        kept = [os.path.realpath(r.snapshot_ref["location"]) for r in out.records]
        left = [os.path.realpath(p) for p in state.iterdir()    # shared caches aside
                if not p.name.startswith(("etc-template", "verifier-files"))]
        # only the kept episodes' snapshots remain; cancelled ones' were discarded
        assert all(any(k == p or k.startswith(p + os.sep) for k in kept) for p in left), (left, kept)
    finally:
        for r in out.records:
            discard_snapshot_ref(r.snapshot_ref)


def test_episode_aware_policies_hear_every_end_and_cancel(tasks, layout):
    """``end_episode`` reaches the policy once for every episode that started: finished ones and
    the ones over-sampling cancelled (so an episode-aware sampler frees their KV caches)."""

    class Ends(SlowForOdd):
        ended: list = []

        def end_episode(self, episode_id):
            self.ended.append(episode_id)

    specs = group_specs(tasks[:1], group_size=4)
    policy = Ends(tasks[:1])
    out = run_rollouts(specs, policy, layout, RolloutConfig(concurrency=4, progress=False,
                                                            budgets=Budgets(max_turns=50)), keep_first=2)
    started = [r.episode_id for r in out.records + out.cancelled]
    assert len(out.cancelled) >= 1 and sorted(policy.ended) == sorted(started)


def test_recovery_rollout_restores_state_and_prepends_history(tasks, layout):
    task = tasks[0]

    class Parent:
        name = "parent"

        def generate(self, requests):
            r = requests[0]
            if r.turn == 1:
                return [Generation(text=format_action("mark", "echo broken > /app/.parent-was-here"))]
            return [Generation(text=format_action("give up", None))]

    parent_out = run_rollouts(group_specs([task], 1), Parent(), layout,
                              RolloutConfig(concurrency=1, snapshot_before_verify=True, progress=False))
    (parent,) = parent_out.records
    assert parent.status is EpisodeStatus.VERIFIED_FAIL and parent.snapshot_ref is not None
    try:
        class Checker(ScriptedPolicy):
            """First recovery turn: look at what the parent left; then the scripted teacher."""

            def generate(self, requests):
                return [self.one(r) for r in requests]

            def one(self, r):
                msgs = list(r.messages)
                at = max(i for i, m in enumerate(msgs) if m["content"] == RECOVERY_PROMPT)
                if at == len(msgs) - 1:
                    return Generation(text=format_action("check", "cat /app/.parent-was-here"))
                del msgs[at + 1:at + 3]  # hide the check turn from the replay counter
                return super().generate([dataclasses.replace(r, messages=tuple(msgs))])[0]

        specs = recovery_specs(task, parent, group_size=2)
        out = run_rollouts(specs, Checker([task]), layout, RolloutConfig(concurrency=2, progress=False))
        assert len(out.records) == 2
        for rec in out.records:
            assert rec.kind == "recovery" and rec.parent_episode_id == parent.episode_id
            assert rec.status is EpisodeStatus.VERIFIED_PASS, rec.error
            first = rec.turns[0]
            assert first.turn == parent.turns[-1].turn + 1
            assert first.command == "cat /app/.parent-was-here" and "broken" in first.observation
            assert rec.messages[:len(parent.messages)] == parent.messages  # h_f in context
            (seq,) = episode_to_sequences(rec, reward=1.0)
            inherited = sum(len(s.tokens) for s in rec.segments if s.source == "inherited")
            assert inherited > 0
            n_parent = sum(len(s.tokens) for s in parent.segments)
            assert not seq["actor_mask"][:n_parent - len(layout.header_ids)].any()
    finally:
        discard_snapshot_ref(parent.snapshot_ref)


def test_bad_engine_arguments_are_named(tasks, layout):
    specs = group_specs(tasks[:1], 2)
    with pytest.raises(ValueError, match="keep_first=5"):
        run_rollouts(specs, ScriptedPolicy(tasks[:1]), layout, keep_first=5)
    with pytest.raises(ValueError, match="group_size=0"):
        group_specs(tasks, 0)
    spec = EpisodeSpec(task=tasks[0], episode_id="x")
    with pytest.raises(ValueError, match="no pre-verifier snapshot"):
        from tr.agent.records import EpisodeRecord
        recovery_specs(tasks[0], EpisodeRecord(episode_id="p", task_id=spec.task.id), 2)


def test_the_same_engine_runs_on_docker(tasks, layout):
    """Backend-agnostic: one scripted episode in a real Docker container, pre-verifier snapshot
    included (a committed image), then a recovery rollout restored from it."""
    from tr.envs.tasks import load_suite

    task = next(t for t in load_suite() if t.id == "data-csv-to-json")  # python3 only: any image
    cfg = RolloutConfig(backend="docker", concurrency=1, progress=False, snapshot_before_verify=True)
    (rec,) = run_rollouts(group_specs([task], 1), ScriptedPolicy([task]), layout, cfg).records
    try:
        assert rec.status is EpisodeStatus.VERIFIED_PASS, rec.error
        assert rec.snapshot_ref["backend"] == "docker" and rec.snapshot_ref["image"]
        (again,) = run_rollouts(recovery_specs(task, rec, 1), ScriptedPolicy([task]), layout,
                                RolloutConfig(backend="docker", concurrency=1, progress=False)).records
        assert again.kind == "recovery" and again.status.counts, again.error
    finally:
        discard_snapshot_ref(rec.snapshot_ref)
