"""RSR's data path (`tr.agent.runbook`) on gym tasks: cleaning, the leak gate against attacks,
the HTTP planner/reviewer against a real local OpenAI-compatible server, and the replay's plain
prompt on a real sandboxed episode."""

import re

import pytest

from tr.agent import runbook as rb
from tr.agent.records import EpisodeRecord, EpisodeStatus, TurnRecord, episode_to_sequences
from tr.envs import gym


@pytest.fixture(scope="module")
def tasks():
    return {t.family: t for t in gym.split_tasks("train", 14)}


def turn(i, command, exit_code=0, observation="", kind="command", timed_out=False):
    return TurnRecord(turn=i, kind=kind, text="", command=command, observation=observation,
                      exit_code=exit_code, timed_out=timed_out)


def test_clean_steps_drops_failed_and_noop_commands():
    record = EpisodeRecord("e", "t", status=EpisodeStatus.VERIFIED_PASS, passed=True, turns=[
        turn(0, "ls"), turn(1, "cat nope.txt", exit_code=1), turn(2, "pwd"), turn(3, "true"),
        turn(4, "# just a comment"), turn(5, "cp a b"), turn(6, "cp a b"),
        turn(7, "sleep 100", exit_code=None, timed_out=True), turn(8, "echo"),
        turn(9, None, kind="format_error", exit_code=None), turn(10, "echo hi > b"),
        turn(11, None, kind="done", exit_code=None)])
    assert [s.command for s in rb.clean_steps(record)] == ["ls", "cp a b", "echo hi > b"]


def test_reference_runbooks_of_every_family_pass_the_gate(tasks):
    planner, reviewer = rb.CommandListPlanner(), rb.LeakRuleReviewer()
    for family, task in sorted(tasks.items()):
        steps = [rb.Step(c, "", 0) for c in gym.solution_commands(task)]
        runbook = planner.plan(task, steps)
        assert runbook.startswith("1. Run: ") and runbook.endswith("reply DONE.")
        verdict = reviewer.review(task, runbook)
        assert verdict.accept, (family, runbook, verdict.reasons)


@pytest.mark.parametrize("attack, reason", [
    ("1. Run: cat /tests/test_checks.py\n2. Do what it checks.", "verifier path '/tests'"),
    ("1. Read tests/test_checks.py first.", "verifier path 'tests/'"),
    ("1. Make test_checks pass.", "test file name 'test_checks'"),
    ("1. Run: bash /solution/solve.sh", "verifier path '/solution'"),
    ("1. Run: sh solve.sh", "verifier path 'solve.sh'"),
    ("1. Look in /logs/verifier for hints.", "verifier path '/logs/verifier'"),
    ("1. Run: echo {total} > /app/total.txt\n2. Reply DONE.", "value '{total}' appears only in the tests"),
])
def test_the_reviewer_rejects_leaks(tasks, attack, reason):
    task = tasks["sum-column"]
    total = _expected_total(task)
    verdict = rb.LeakRuleReviewer().review(task, attack.format(total=total))
    assert not verdict.accept
    assert reason.format(total=total) in verdict.reasons, verdict.reasons


def _expected_total(task) -> str:
    """The sum the sum-column checks expect: a number in the tests, not in the task's files."""
    rows = [line.split(",") for line in
            (task.source_dir / "environment" / "files" / "data.csv").read_text().splitlines()]
    column = re.search(r"column (\w+)", task.instruction).group(1)
    index = rows[0].index(column)
    total = str(sum(int(r[index]) for r in rows[1:]))
    assert total in rb.TaskSecrets.of(task).test_values
    return total


def test_values_the_task_shows_are_not_leaks(tasks):
    task = tasks["copy-keep"]          # the expected content is the source file's: public
    content = (task.source_dir / "environment" / "files").rglob("*.txt").__next__().read_text()
    word = content.split()[0]
    assert rb.leak_findings(f"1. Check the copy starts with {word}.", rb.TaskSecrets.of(task)) == []
    assert rb.schema_findings("") == ["empty runbook", ]
    assert rb.schema_findings("just prose") == ["no numbered or bulleted step"]
    assert "chat control token in the runbook" in rb.schema_findings("1. <|im_end|>")


def test_replay_leaks_checks_the_replay_commands(tasks):
    task = tasks["sum-column"]
    secrets = rb.TaskSecrets.of(task)
    total = _expected_total(task)
    reads = EpisodeRecord("r", task.id, turns=[turn(0, "cat /tests/test_checks.py", exit_code=1)])
    assert rb.replay_leaks(reads, secrets) == [
        "turn 0: verifier path '/tests'", "turn 0: test file name 'test_checks'",
        "turn 0: test file name 'test_checks.py'"]
    hard_coded = EpisodeRecord("h", task.id, turns=[turn(0, f"echo {total} > total.txt")])
    assert rb.replay_leaks(hard_coded, secrets) == [
        f"turn 0: value '{total}' appears only in the tests"]
    derived = EpisodeRecord("d", task.id, turns=[   # computed, seen, then written: not a leak
        turn(0, "awk -F, 'NR>1{s+=$1} END{print s}' data.csv", observation=f"exit_code: 0\n{total}"),
        turn(1, f"echo {total} > total.txt")])
    assert rb.replay_leaks(derived, secrets) == []


# ------------------------------------------------------------------------------------------------
# HTTP planner and reviewer against tr's own OpenAI-compatible server


class RuleModel:
    """What the served model does: plans like CommandListPlanner from the `$ command` lines of the
    prompt, reviews like LeakRuleReviewer; records every request it saw."""

    name = "rule-model"

    def __init__(self, tasks_by_id, leak_plan: str | None = None):
        self.tasks_by_id, self.leak_plan, self.seen = tasks_by_id, leak_plan, []

    def generate(self, requests):
        from tr.agent.transcript import Generation

        out = []
        for req in requests:
            self.seen.append(req)
            user = req.messages[-1]["content"]
            if req.purpose == "plan":
                commands = re.findall(r"^\$ (.*)$", user, re.M)
                text = self.leak_plan or "```\n" + rb.CommandListPlanner().plan(
                    None, [rb.Step(c, "", 0) for c in commands]) + "\n```"
            else:
                runbook = user.split("Runbook:\n", 1)[1].split("\n\nTest files", 1)[0]
                verdict = rb.LeakRuleReviewer().review(self.tasks_by_id[req.task_id], runbook)
                text = ("Looks fine.\nVERDICT: ACCEPT" if verdict.accept else
                        f"It leaks.\nVERDICT: REJECT {'; '.join(verdict.reasons)}")
            out.append(Generation(text=text, source="teacher"))
        return out


@pytest.fixture
def served(tasks):
    from tr.agent.server import ChatServer
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer

    model = RuleModel({t.id: t for t in tasks.values()})
    with ChatServer(model, ChatLayout(ByteTokenizer()), model_name="rule-model") as server:
        yield server, model


def test_http_planner_and_reviewer_through_a_real_server(served, tasks):
    server, model = served
    task = tasks["follow-pointer"]
    steps = [rb.Step("cat next.txt", "exit_code: 0\nlotus", 0),
             rb.Step("cp store/lotus found.txt", "exit_code: 0\n(no output)", 0)]
    planner = rb.make_planner("http", base_url=server.url, model="rule-model")
    reviewer = rb.make_reviewer("http", base_url=server.url, model="rule-model")
    runbook = planner.plan(task, steps)
    assert runbook == rb.CommandListPlanner().plan(task, steps)       # fence removed
    assert reviewer.review(task, runbook) == rb.Verdict(True)
    plan_req, review_req = model.seen
    assert plan_req.purpose == "plan" and review_req.purpose == "review"
    system, _ = rb.load_prompt(rb.PLANNER_PROMPT)
    assert plan_req.messages[0]["content"] == system
    assert task.instruction in plan_req.messages[1]["content"]
    assert "$ cp store/lotus found.txt" in plan_req.messages[1]["content"]
    tests_text = (task.tests_dir / "test_checks.py").read_text()
    assert "test_checks" not in plan_req.messages[1]["content"]       # the planner never sees tests
    assert tests_text.strip() in review_req.messages[1]["content"]    # the reviewer does

    leaky = "1. Run: cat /tests/test_checks.py\n2. Copy what it expects."
    verdict = reviewer.review(task, leaky)
    assert not verdict.accept and "verifier path '/tests'" in verdict.reasons[0]


def test_http_reviewer_without_a_verdict_line_rejects(tasks):
    from tr.agent.server import ChatServer
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer

    class Chatty:
        name = "chatty"

        def generate(self, requests):
            from tr.agent.transcript import Generation
            return [Generation(text="I think it is probably fine.") for _ in requests]

    with ChatServer(Chatty(), ChatLayout(ByteTokenizer())) as server:
        verdict = rb.make_reviewer("http", base_url=server.url, model="chatty").review(
            tasks["write-file"], "1. Run: echo hi")
    assert not verdict.accept and verdict.reasons[0].startswith("no VERDICT line")


# ------------------------------------------------------------------------------------------------
# Replay with the runbook, trained on the plain prompt


def test_replay_then_plain_prompt_on_a_real_episode(tasks):
    import dataclasses

    from tr.agent.harness import Budgets
    from tr.agent.policies import ScriptedPolicy
    from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
    from tr.agent.transcript import ChatLayout
    from tr.models import embedded

    task = tasks["follow-pointer"]
    runbook = rb.CommandListPlanner().plan(task, [rb.Step(c, "", 0)
                                                  for c in gym.solution_commands(task)])
    replay_task = dataclasses.replace(rb.with_runbook(task, runbook), id=f"{task.id}@rb0")
    layout = ChatLayout(embedded.load_tokenizer())
    out = run_rollouts(group_specs([replay_task], 1), ScriptedPolicy([replay_task], source="policy"),
                       layout, RolloutConfig(concurrency=1, progress=False,
                                             budgets=Budgets(max_turns=gym.MAX_TURNS),
                                             system_prompt=embedded.SYSTEM_PROMPT))
    (record,) = out.records
    assert record.passed and record.messages[1]["content"] == replay_task.instruction
    assert rb.replay_leaks(record, rb.TaskSecrets.of(task)) == []

    plain = rb.plain_prompt(record, layout, embedded.SYSTEM_PROMPT, replay_task.instruction,
                            task.instruction)
    assert plain.messages[1]["content"] == task.instruction
    want = layout.prompt_ids(embedded.SYSTEM_PROMPT, task.instruction)
    assert plain.segments[0].tokens[:len(want)] == want
    assert [s.tokens for s in plain.segments[1:]] == [s.tokens for s in record.segments[1:]]
    (seq,) = episode_to_sequences(plain, 1.0, loss_sources=("policy",))
    text = layout.tokenizer.decode(seq["tokens"].tolist())
    assert "Runbook" not in text and task.instruction in text
    actions = [t for s in record.segments if s.kind == "action" for t in s.tokens]
    assert int(seq["loss_mask"].sum()) == len(actions) > 0
    with pytest.raises(ValueError, match="not the replay prompt"):
        rb.plain_prompt(record, layout, embedded.SYSTEM_PROMPT, task.instruction, task.instruction)
