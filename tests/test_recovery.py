"""ReTerm data and the recovery queue (tr/agent/recovery.py) on the gym, in real local sandboxes.

A failing actor (a family's plausible mistake, then DONE) leaves real failure states; the embedded
teacher recovers from the restored snapshot (the real verifier passes), while replaying the
reference from there fails on families whose mistake must be undone — so the state really is the
failure's.  Filters, the condensed prompt, teacher-only loss tokens, the shards, the queue's order,
eviction and snapshot clean-up, error categories and Recovery@k are checked against hand-computed
expectations.
"""

import json
import os
from pathlib import Path

import pytest

from tr.agent import recovery as rc
from tr.agent.harness import RECOVERY_PROMPT, format_action
from tr.agent.policies import ScriptedPolicy
from tr.agent.records import EpisodeRecord, EpisodeStatus, TurnRecord
from tr.agent.rollout import RolloutConfig
from tr.agent.transcript import ChatLayout, Generation
from tr.envs import gym
from tr.models.tokenizer import ByteTokenizer

FAMILIES = ("copy-keep", "move-logs", "write-file", "follow-pointer")


@pytest.fixture(scope="module")
def gym_cache(tmp_path_factory):
    old = os.environ.get("TR_GYM_DIR")
    os.environ["TR_GYM_DIR"] = str(tmp_path_factory.mktemp("gym-cache"))
    yield
    if old is None:
        os.environ.pop("TR_GYM_DIR")
    else:
        os.environ["TR_GYM_DIR"] = old


class MistakeActor:
    """A stand-in failing actor: the family's first plausible mistake, then DONE."""

    name = "mistaker"

    def __init__(self, tasks):
        self.plans = {t.id: gym.mistake_commands(t)[0] for t in tasks}

    def generate(self, requests):
        return [Generation(text=format_action("go", self.plans[r.task_id])
                           if r.turn == 1 else format_action("done", None))
                for r in requests]


class Quitter:
    name = "quitter"

    def generate(self, requests):
        return [Generation(text=format_action("done", None)) for _ in requests]


@pytest.fixture(scope="module")
def world(gym_cache):
    tasks = [gym.split_tasks("train", 1, families=[f])[0] for f in FAMILIES]
    layout = ChatLayout(ByteTokenizer())
    config = RolloutConfig(concurrency=4, progress=False, batch_window_s=0.0)
    failures, stats = rc.collect_failures(MistakeActor(tasks), tasks, 1, layout, config)
    yield tasks, {t.id: t for t in tasks}, layout, config, failures, stats
    rc.discard_failures(failures)
    for f in failures:
        assert not Path(f.snapshot_ref["location"]).exists()


def test_failures_keep_history_and_a_persisted_snapshot(world):
    tasks, _, _, _, failures, stats = world
    assert stats["episodes"] == 4 and stats["failures"] == 4 and stats["passed"] == 0
    for f in failures:
        assert f.status is EpisodeStatus.VERIFIED_FAIL and not f.passed
        assert f.snapshot_ref["persistent"] and Path(f.snapshot_ref["location"]).is_dir()
        assert f.messages[-1]["role"] == "assistant" and f.turns[0].command


def test_embedded_teacher_recovers_from_the_state_it_finds(world):
    tasks, by_id, layout, config, failures, _ = world
    recs = rc.teacher_recoveries(rc.EmbeddedTeacher(tasks), failures, by_id, layout, config)
    assert len(recs) == 4
    for r in recs:
        assert r.kind == "recovery" and r.passed, (r.task_id, r.error, r.turns)
        assert r.turns[0].command == rc.INSPECT_COMMAND
        assert r.recovery_prompt == rc.TEACHER_RECOVERY_PROMPT
        # told only that it failed: no verifier output anywhere in what the teacher saw
        assert not any("test_" in m["content"] for m in r.messages)
    # replaying the reference from s_f fails where the mistake must be undone (copy-keep moved
    # the input away; move-logs moved the csv files too): the restored state is the failure's
    replays = rc.teacher_recoveries(ScriptedPolicy(tasks), failures, by_id, layout, config)
    passed = {r.family: bool(r.passed) for r in replays}
    assert passed["copy-keep"] is False and passed["move-logs"] is False

    # the student's own THOUGHT phrases (`teacher.thoughts = "student"`): the same commands
    student = rc.teacher_recoveries(
        rc.EmbeddedTeacher(tasks, thoughts=("Next step.", "Next step.", "The task is complete.")),
        failures, by_id, layout, config)
    for r, s in zip(recs, student):
        assert s.passed and [t.command for t in s.turns] == [t.command for t in r.turns]
        start = max(i for i, m in enumerate(s.messages) if m["content"] == s.recovery_prompt)
        said = [m["content"] for m in s.messages[start:] if m["role"] == "assistant"]
        assert len(said) >= 2
        assert all(x.startswith("THOUGHT: Next step.") for x in said[:-1])
        assert said[-1].startswith("THOUGHT: The task is complete.")
    with pytest.raises(ValueError, match="thoughts needs 3 lines"):
        rc.EmbeddedTeacher(tasks, thoughts=("Next step.",))

    rows, counts = rc.build_dataset(failures, recs + replays, by_id, layout)
    assert counts["recoveries"] == 8 and counts["kept"] == 4 + sum(passed.values())
    assert counts["rejected_by"]["verifier"] == sum(not r.passed for r in replays)
    assert sum(counts["rejected_by"].values()) + counts["kept"] == 8
    tok = layout.tokenizer
    for row, rec in zip(rows, recs):
        text = tok.decode(row["tokens"])
        assert RECOVERY_PROMPT in text and "recovery workflow" not in text   # condensed r
        assert row["r"] == RECOVERY_PROMPT and row["x"] == by_id[row["task_id"]].instruction
        teacher = sum(len(s.tokens) for s in rec.segments if s.source == "teacher")
        assert sum(row["loss_mask"]) == teacher > 0                     # teacher tokens only
        inherited = [s for s in rec.segments if s.source == "inherited"]
        n_prefix = sum(len(s.tokens) for s in rec.segments[:rec.segments.index(inherited[-1]) + 1])
        assert not any(row["loss_mask"][:n_prefix])                     # h_f is context
        assert [m["role"] for m in row["y"]][0] == "assistant"
        assert row["h_f"][-1]["role"] == "assistant"
        # the condensed layout equals a transcript built with r directly
        assert len(row["tokens"]) == (sum(len(s.tokens) for s in rec.segments)
                                      - len(tok.encode(rc.TEACHER_RECOVERY_PROMPT))
                                      + len(tok.encode(RECOVERY_PROMPT)))


def test_shards_round_trip_and_bad_lines_are_named(tmp_path):
    rows = [{"x": "t", "h_f": [], "r": "r", "y": [], "tokens": [1, 2], "loss_mask": [0, 1]}] * 5
    paths = rc.write_shards(rows, tmp_path, shard_size=2)
    assert len(paths) == 3 and rc.read_shards(paths) == rows
    seqs = rc.sft_sequences(rc.read_shards(paths))
    assert seqs[0]["loss_mask"].tolist() == [False, True]
    Path(paths[0]).write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match=r"recoveries-00000.jsonl:1: missing field"):
        rc.read_shards(paths)


def _rec(commands, *, passed=True, exit_codes=None, fmt=0, status=EpisodeStatus.VERIFIED_PASS):
    exit_codes = exit_codes or [0] * len(commands)
    turns = [TurnRecord(turn=i + 1, kind="command", text="", command=c, exit_code=e)
             for i, (c, e) in enumerate(zip(commands, exit_codes))]
    turns.append(TurnRecord(turn=len(turns) + 1, kind="done", text=""))
    return EpisodeRecord(episode_id="e", task_id="t", status=status, passed=passed, turns=turns,
                         format_errors=fmt)


def test_filters_by_rule_and_the_optional_judge():
    instr = "Copy /app/data/a.txt to /app/backup/a.bak and keep the original file."
    assert rc.filter_recovery(_rec(["cp data/a.txt backup/a.bak"]), instr)[0] is None
    assert rc.filter_recovery(_rec(["ls"], passed=False), instr)[0] == "verifier"
    assert rc.filter_recovery(_rec(["ls"], fmt=1), instr)[0] == "format"
    assert rc.filter_recovery(_rec(["cat /tests/test_checks.py"]), instr)[0] == "compliance"
    assert rc.filter_recovery(_rec(["rm data/a.txt"]), instr)[0] == "compliance"
    assert rc.filter_recovery(_rec(["rm -rf /app"]), instr)[0] == "compliance"
    assert rc.filter_recovery(_rec(["rm data/b.txt"]), instr)[0] is None
    looping = _rec(["cp x y", "cp x y", "ls"], exit_codes=[1, 1, 0])
    assert rc.filter_recovery(looping, instr)[0] == "efficiency"
    assert rc.filter_recovery(_rec(["ls", "ls", "ls"]), instr)[0] == "efficiency"

    class Judge:   # the remote LLM judge cannot exist here: a fake endpoint that answers KEEP
        name = "judge"

        def __init__(self, word):
            self.word, self.seen = word, []

        def generate(self, reqs):
            self.seen += reqs
            return [Generation(text=self.word) for _ in reqs]

    keep = Judge("KEEP")
    assert rc.filter_recovery(looping, instr, rc.HttpJudge(keep))[0] is None
    assert "repeats a failing command" in keep.seen[0].messages[0]["content"]
    assert rc.filter_recovery(looping, instr, rc.HttpJudge(Judge("REJECT")))[0] == "efficiency"


def test_llm_judge_through_a_real_http_endpoint():
    """The optional judge as deployed: HttpJudge -> HttpPolicy -> a local OpenAI-compatible server
    (tr.agent.server) whose model answers KEEP or REJECT from the prompt it was sent."""
    from tr.agent.http_policy import HttpPolicy
    from tr.agent.server import ChatServer

    class RuleJudge:     # the served "LLM": rejects a recovery whose commands delete anything
        name = "rule-judge"

        def __init__(self):
            self.prompts = []

        def generate(self, reqs):
            self.prompts += [r.messages[-1]["content"] for r in reqs]
            return [Generation(text="REJECT" if " rm " in f" {r.messages[-1]['content']}" else
                               "KEEP: fine") for r in reqs]

    instr = "Copy /app/data/a.txt to /app/backup/a.bak and keep the original file."
    served = RuleJudge()
    with ChatServer(served, ChatLayout(ByteTokenizer())) as server:
        judge = rc.HttpJudge(HttpPolicy(server.url, "rule-judge", temperature=0.0, top_p=1.0,
                                        source="judge", retries=1, timeout_s=30))
        looping = _rec(["cp x y", "cp x y", "ls"], exit_codes=[1, 1, 0])
        assert rc.filter_recovery(looping, instr, judge)[0] is None          # flagged, kept
        deleting = _rec(["rm data/a.txt"])
        assert rc.filter_recovery(deleting, instr, judge)[0] == "compliance"  # flagged, rejected
        clean = _rec(["cp data/a.txt backup/a.bak"])
        assert rc.filter_recovery(clean, instr, judge)[0] is None            # never asked
    assert len(served.prompts) == 2
    assert "wastes turns" in served.prompts[0] and "acts against" in served.prompts[1]
    assert instr in served.prompts[1]


def test_error_categories_by_rule():
    assert rc.error_category(_rec(["ls"], status=EpisodeStatus.TURN_CAP)) == "resource_management"
    assert rc.error_category(_rec(["pyhton x"], exit_codes=[127])) == "tool_use"
    assert rc.error_category(_rec(["ls"], fmt=1)) == "tool_use"
    assert rc.error_category(_rec(["cp a b"], exit_codes=[1])) == "implementation"
    assert rc.error_category(_rec(["cp a b"])) == "verification"
    assert rc.error_category(_rec(["cp a b", "cat b"])) == "planning"


def test_queue_front_insert_front_first_capacity_and_no_leaks(world, tmp_path):
    discarded = []
    q = rc.RecoveryQueue(3, discard=discarded.append)
    items = [EpisodeRecord(episode_id=f"f{i}", task_id="t", snapshot_ref={"id": i})
             for i in range(5)]
    for it in items:
        q.push(it)
    assert [x.episode_id for x in q.items] == ["f4", "f3", "f2"]          # newest at the front
    assert discarded == [{"id": 0}, {"id": 1}] and q.evicted == 2          # oldest evicted
    assert [x.episode_id for x in q.pop(2)] == ["f4", "f3"]               # front first
    q.close()
    assert discarded[-1] == {"id": 2} and len(q) == 0
    assert q.stats()["inserted"] == 5
    u = rc.RecoveryQueue(8, sampling="uniform", seed=1, discard=lambda ref: None)
    for it in items:
        u.push(it)
    got = [x.episode_id for x in u.pop(5)]
    assert sorted(got) == sorted(f"f{i}" for i in range(5))
    with pytest.raises(ValueError, match="capacity=0"):
        rc.RecoveryQueue(0)
    with pytest.raises(ValueError, match="sampling='lifo'"):
        rc.RecoveryQueue(2, sampling="lifo")

    # real snapshots: an evicted failure's snapshot folder is gone from disk
    tasks, by_id, layout, config, _, _ = world
    fails, _ = rc.collect_failures(MistakeActor(tasks[:2]), tasks[:2], 1, layout, config,
                                   prefix="queue")
    real = rc.RecoveryQueue(1)
    real.push(fails[0])
    real.push(fails[1])
    assert not Path(fails[0].snapshot_ref["location"]).exists()
    assert Path(fails[1].snapshot_ref["location"]).exists()
    real.close()
    assert not Path(fails[1].snapshot_ref["location"]).exists()


def test_recovery_at_k_on_fixed_failure_states(world):
    tasks, by_id, layout, config, failures, _ = world
    good = rc.recovery_at_k(rc.EmbeddedTeacher(tasks), failures, by_id, 2, layout, config)
    assert good["recovery_at_k"] == 1.0 and good["k"] == 2 and good["states"] == 4
    assert good["episodes"] == 8 and good["mean_turns"] >= 2
    assert sum(v["states"] for v in good["by_category"].values()) == 4
    bad = rc.recovery_at_k(Quitter(), failures, by_id, 1, layout, config)
    # write-file's mistake leaves nothing the checks see: DONE alone still fails everywhere
    assert bad["recovery_at_k"] == 0.0 and bad["mean_turns"] == 1
    for f in failures:                                   # the fixed states are still there
        assert Path(f.snapshot_ref["location"]).is_dir()
    # the attempts come back as records (the reterm job writes them as a shard per arm)
    assert sorted(r.parent_episode_id for r in good["records"]) == sorted(
        f.episode_id for f in failures for _ in range(2))
    assert sum(bool(r.passed) for r in bad["records"]) == 0
    json.dumps({k: v for k, v in good.items() if k != "records"})


def test_http_teacher_through_an_openai_compatible_endpoint(world):
    """The OpenAI-compatible teacher path: the embedded teacher served over real HTTP
    (tr.agent.server) and driven through HttpPolicy; its turns are teacher tokens."""
    from tr.agent.server import ChatServer

    tasks, by_id, layout, config, failures, _ = world
    with ChatServer(rc.EmbeddedTeacher(tasks), layout) as server:
        teacher = rc.make_teacher("http", base_url=server.url, model="embedded-teacher")
        recs = rc.teacher_recoveries(teacher, failures[:2], by_id, layout, config)
    assert all(r.passed for r in recs), [(r.task_id, r.error) for r in recs]
    rows, counts = rc.build_dataset(failures, recs, by_id, layout)
    assert counts["kept"] == 2 and all(sum(row["loss_mask"]) > 0 for row in rows)
    with pytest.raises(ValueError, match="teacher kind 'gpt'"):
        rc.make_teacher("gpt")


def test_condensed_prompt_when_the_failure_ends_on_an_observation(world):
    """A failure cut by the turn cap ends on an observation (not an action): the teacher still
    recovers and its row carries the condensed r."""
    import dataclasses

    from tr.agent.harness import Budgets

    tasks, by_id, layout, config, _, _ = world

    class Looker:
        name = "looker"

        def generate(self, requests):
            return [Generation(text=format_action("look", "ls")) for _ in requests]

    capped = dataclasses.replace(config, budgets=Budgets(max_turns=1))
    fails, _ = rc.collect_failures(Looker(), tasks[:1], 1, layout, capped, prefix="cap")
    try:
        assert fails[0].status is EpisodeStatus.TURN_CAP
        assert fails[0].segments[-1].kind == "observation"
        recs = rc.teacher_recoveries(rc.EmbeddedTeacher(tasks), fails, by_id, layout, config)
        rows, counts = rc.build_dataset(fails, recs, by_id, layout)
        assert counts["kept"] == 1
        text = layout.tokenizer.decode(rows[0]["tokens"])
        assert RECOVERY_PROMPT in text and rc.TEACHER_RECOVERY_PROMPT not in text
        assert rc.error_category(fails[0]) == "resource_management"
    finally:
        rc.discard_failures(fails)


# ----------------------------------------------------------------------------------------------
# A capped history: the recovery inherits the task prompt and only the last N turns of h_f.

class Wanderer:
    """A failing actor with a longer history: two looks, the family's mistake, then DONE."""

    name = "wanderer"

    def __init__(self, tasks):
        self.plans = {t.id: ["ls /app", "pwd", gym.mistake_commands(t)[0]] for t in tasks}

    def generate(self, requests):
        out = []
        for r in requests:
            plan = self.plans[r.task_id]
            out.append(Generation(text=format_action("go", plan[r.turn - 1]) if r.turn <= len(plan)
                                  else format_action("done", None)))
        return out


class Recorder:
    """Wraps a policy; keeps the messages and token context of every first recovery request."""

    def __init__(self, policy):
        self.policy, self.name, self.first = policy, "recorder", {}

    def generate(self, requests):
        for r in requests:
            if r.messages[-1]["role"] == "user" and r.messages[-1]["content"] in (
                    RECOVERY_PROMPT, rc.TEACHER_RECOVERY_PROMPT):
                self.first[r.episode_id] = (list(r.messages), list(r.prompt_tokens))
        return self.policy.generate(requests)


@pytest.fixture(scope="module")
def long_failures(world):
    tasks, by_id, layout, config, _, _ = world
    fails, _ = rc.collect_failures(Wanderer(tasks[:2]), tasks[:2], 1, layout, config, prefix="long")
    yield fails
    rc.discard_failures(fails)


def _body(segments):
    return [s for s in segments if s.kind != "prompt"]


def test_inherit_keeps_the_prompt_and_the_last_turns(world, long_failures):
    from tr.agent.transcript import Transcript, history_note, transcript_from_messages

    _, by_id, layout, _, _, _ = world
    hdr = layout.header_ids
    for f in long_failures:
        assert f.status is EpisodeStatus.VERIFIED_FAIL and [t.turn for t in f.turns] == [1, 2, 3, 4]
        system, task = f.messages[0]["content"], f.messages[1]["content"]
        assert task == by_id[f.task_id].instruction
        for n in (0, 1, 2, 3, 4, 7):
            tr = Transcript(layout)
            tr.inherit(f, n)
            assert all(s.source in ("env", "inherited") for s in tr.segments)
            if n == 0 or n >= 4:             # everything: today's behaviour
                assert [s.tokens for s in tr.segments] == [s.tokens for s in f.segments]
                assert tr.messages == f.messages
                continue
            kept = [s for s in _body(f.segments) if s.turn > 4 - n]
            assert tr.segments[0].kind == "prompt" and tr.segments[0].turn == 0
            note = tr.segments[1]
            assert (note.kind, note.source, note.turn) == ("observation", "env", 4 - n)
            assert note.tokens == layout.user_ids(history_note(4 - n), close_action=False) + hdr
            assert [(s.kind, s.turn, s.tokens) for s in tr.segments[2:]] == \
                [(s.kind, s.turn, s.tokens) for s in kept]
            assert sorted({s.turn for s in tr.segments[2:]}) == list(range(5 - n, 5))
            # messages: system, task, the note, then the kept turns' messages (2 per turn but the
            # last, DONE), the same ones the parent had
            assert tr.messages[:3] == [f.messages[0], f.messages[1],
                                       {"role": "user", "content": history_note(4 - n)}]
            assert tr.messages[3:] == f.messages[-len(kept):] and len(kept) == 2 * n - 1
            assert len(tr.messages) == 2 + len(_body(tr.segments))
            # the token context = the prompt + the note + the kept turns, and equals a transcript
            # laid out from the capped messages (text replies: encoded once)
            assert tr.context_ids() == (layout.prompt_ids(system, task)
                                        + note.tokens + [t for s in kept for t in s.tokens])
            assert transcript_from_messages(layout, tr.messages).context_ids() == tr.context_ids()
            assert tr.context_len() < sum(len(s.tokens) for s in f.segments)
        with pytest.raises(ValueError, match="history_turns=-1 must be >= 0"):
            Transcript(layout).inherit(f, -1)
    assert history_note(1) == "(1 earlier turn omitted)"


def test_capped_recoveries_rows_and_recovery_at_k(world, long_failures):
    """Teacher rows from a capped h_f: the recovery saw exactly the capped context, the row's h_f
    is the kept turns and its tokens are that context + r + the teacher's turns; Recovery@k's
    attempts and the harness's spec see the same cut."""
    from tr.agent.harness import EpisodeSpec
    from tr.agent.rollout import recovery_specs
    from tr.agent.transcript import Transcript, history_note, transcript_from_messages

    tasks, by_id, layout, config, _, _ = world
    full_rows, _ = rc.build_dataset(long_failures, rc.teacher_recoveries(
        rc.EmbeddedTeacher(tasks), long_failures, by_id, layout, config), by_id, layout)
    teacher = Recorder(rc.EmbeddedTeacher(tasks))
    recs = rc.teacher_recoveries(teacher, long_failures, by_id, layout, config, history_turns=1)
    rows, counts = rc.build_dataset(long_failures, recs, by_id, layout)
    assert counts["kept"] == 2 and [r.history_turns for r in recs] == [1, 1]
    parents = {f.episode_id: f for f in long_failures}
    for rec, row, full in zip(recs, rows, full_rows):
        parent = parents[rec.parent_episode_id]
        capped = Transcript(layout)
        capped.inherit(parent, 1)
        seen_messages, seen_tokens = teacher.first[rec.episode_id]
        assert seen_messages[:-1] == capped.messages         # the teacher saw the capped h_f
        assert seen_tokens[:capped.context_len()] == capped.context_ids()
        # h_f: task, note, the last turn (DONE) -- the row's tokens are that context, r, y
        assert row["h_f"] == [parent.messages[1], {"role": "user", "content": history_note(3)},
                              parent.messages[-1]]
        assert row["history_turns"] == 1 and row["y"][0]["role"] == "assistant"
        system = parent.messages[0]
        laid = transcript_from_messages(layout, [system] + row["h_f"] + [
            {"role": "user", "content": row["r"]}] + row["y"])
        assert row["tokens"] == laid.context_ids()
        assert row["tokens"][:capped.context_len()] == capped.context_ids()
        assert not any(row["loss_mask"][:capped.context_len()])
        assert sum(row["loss_mask"]) == sum(len(s.tokens) for s in rec.segments
                                            if s.source == "teacher")
        assert len(row["tokens"]) < len(full["tokens"]) and full["y"] == row["y"]
        assert len(full["h_f"]) == len(parent.messages) - 1 == 8
    # a row checks its record's inherited messages against the parent's cut
    bad = rc.EpisodeRecord.from_json(recs[0].to_json())
    bad.history_turns = 2
    with pytest.raises(ValueError, match="not those of"):
        rc.dataset_row(bad, parents[bad.parent_episode_id], "x", layout)

    f = long_failures[0]
    specs = recovery_specs(by_id[f.task_id], f, 2, history_turns=2)
    assert [s.history_turns for s in specs] == [2, 2]
    with pytest.raises(ValueError, match="EpisodeSpec.history_turns=-1"):
        EpisodeSpec(task=by_id[f.task_id], episode_id="x", parent=f, history_turns=-1)
    watcher = Recorder(rc.EmbeddedTeacher(tasks))
    out = rc.recovery_at_k(watcher, long_failures, by_id, 1, layout, config, history_turns=2)
    assert out["recovery_at_k"] == 1.0
    for f in long_failures:
        (msgs, _), = [v for k, v in watcher.first.items() if f.episode_id in k]
        assert msgs[2] == {"role": "user", "content": history_note(2)} and msgs[-1]["content"] == \
            RECOVERY_PROMPT and msgs[3:-1] == f.messages[-3:]


def test_held_out_states_spread_over_the_families():
    """Recovery@k's fixed states: round-robin over the families that failed (sorted), each
    family's in order; the rest returned for discarding, nothing lost or repeated."""
    fams = ["b", "a", "b", "c", "a", "b", "b"]
    failures = [EpisodeRecord(episode_id=f"e{i}", task_id=f"t{i}", family=f,
                              status=EpisodeStatus.VERIFIED_FAIL) for i, f in enumerate(fams)]
    kept, rest = rc.spread_by_family(failures, 5)
    assert [f.episode_id for f in kept] == ["e1", "e0", "e3", "e4", "e2"]   # a b c a b
    assert [f.episode_id for f in rest] == ["e5", "e6"]
    kept, rest = rc.spread_by_family(failures, 99)
    assert sorted(f.episode_id for f in kept) == [f"e{i}" for i in range(7)] and not rest
    assert rc.spread_by_family([], 3) == ([], [])
