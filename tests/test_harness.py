"""The harness: action format, turn loop over real bubblewrap sandboxes, budgets, statuses,
active summarisation, pre-verifier snapshots."""

import io
import threading

import pytest

from tr.agent.harness import (
    SYSTEM_PROMPT, Budgets, EpisodeSpec, format_action, parse_action, run_episode,
)
from tr.agent.policies import ScriptedPolicy
from tr.agent.records import EpisodeStatus, episode_to_sequences
from tr.agent.rollout import TaskEnv
from tr.agent.transcript import ChatLayout, Generation

# ----------------------------------------------------------------------------------------------
# The action format.


def test_parse_command_and_done():
    a = parse_action("THOUGHT: list files\nCOMMAND:\n```bash\nls -la /app\n```")
    assert (a.kind, a.thought, a.command) == ("command", "list files", "ls -la /app")
    a = parse_action("  THOUGHT: multi\nline thought\nCOMMAND:\n```\nfor i in 1 2; do\n  echo $i\ndone\n```\n")
    assert a.kind == "command" and a.command == "for i in 1 2; do\n  echo $i\ndone"
    assert a.thought == "multi\nline thought"
    a = parse_action("THOUGHT: finished\nDONE")
    assert (a.kind, a.thought, a.command) == ("done", "finished", None)


@pytest.mark.parametrize("text, reason", [
    ("ls -la", "must start with 'THOUGHT:'"),
    ("THOUGHT: hmm", "write 'COMMAND:'"),
    ("THOUGHT: x\nCOMMAND: ls", "on the line after 'COMMAND:'"),
    ("THOUGHT: x\nCOMMAND:\nls", "no ```bash"),
    ("THOUGHT: x\nCOMMAND:\n```bash\nls\n```\n```bash\npwd\n```", "more than one command block"),
    ("THOUGHT: x\nCOMMAND:\n```bash\n\n```", "empty"),
    ("THOUGHT: x\nCOMMAND:\n```bash\nls\n```\nand then DONE", "text outside"),
    ("THOUGHT: x\nDONE\nCOMMAND:\n```bash\nls\n```", "write 'COMMAND:'"),
    ("", "must start with 'THOUGHT:'"),
])
def test_malformed_replies_are_invalid_with_a_reason(text, reason):
    a = parse_action(text)
    assert a.kind == "invalid" and reason in a.error


def test_format_action_round_trips():
    for cmd in ["ls", "cat <<'EOF' > f\nx\nEOF", None]:
        a = parse_action(format_action("a  thought\nacross lines", cmd))
        assert a.thought == "a thought across lines" and a.command == cmd
        assert a.kind == ("done" if cmd is None else "command")


def test_budgets_reject_nonsense():
    with pytest.raises(ValueError, match="summarise_at_tokens"):
        Budgets(max_context_tokens=100, summarise_at_tokens=200)
    with pytest.raises(ValueError, match="max_output_tokens"):
        Budgets(max_output_tokens=0)


# ----------------------------------------------------------------------------------------------
# Episodes in real sandboxes.


@pytest.fixture(scope="module")
def tasks():
    from tr.envs.tasks import load_suite

    suite = load_suite()
    by_tier = {}
    for t in suite:
        by_tier.setdefault(t.tier, t)
    return by_tier


@pytest.fixture(scope="module")
def layout():
    from tr.models.tokenizer import ByteTokenizer

    return ChatLayout(ByteTokenizer())


def _run(task, policy, layout, budgets=Budgets(), **kw):
    spec = EpisodeSpec(task=task, episode_id=f"t-{task.id}", seed=kw.pop("seed", 0))
    return run_episode(spec, lambda r: policy.generate([r])[0], TaskEnv("local"), layout, budgets,
                       policy_name=policy.name, **kw)


class Replies:
    """A policy that says fixed replies in order, then DONE."""

    name = "replies"

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def generate(self, requests):
        out = []
        for r in requests:
            self.seen.append(r)
            out.append(Generation(text=self.replies.pop(0) if self.replies else "THOUGHT: end\nDONE"))
        return out


def test_scripted_reference_solution_passes_with_full_record(tasks, layout):
    task = tasks["easy"]
    policy = ScriptedPolicy([task])
    rec = _run(task, policy, layout)
    assert rec.status is EpisodeStatus.VERIFIED_PASS and rec.passed is True, rec.error
    commands = [t.command for t in rec.turns if t.kind == "command"]
    assert commands == policy.commands[task.id]
    assert all(t.exit_code == 0 for t in rec.turns if t.kind == "command")
    assert rec.turns[-1].kind == "done"
    assert rec.verifier["strict_pass"] is True and rec.matched == rec.executed > 0
    (seq,) = episode_to_sequences(rec, reward=1.0)
    assert seq["dones"].sum() == 1 and seq["turn_ids"].max() == len(rec.turns)


def test_format_error_is_an_observation_not_a_crash(tasks, layout):
    policy = Replies(["I think I'll just ls", "THOUGHT: look\nCOMMAND:\n```bash\necho hi; (exit 3)\n```"])
    rec = _run(tasks["easy"], policy, layout)
    assert rec.format_errors == 1 and rec.turns[0].kind == "format_error"
    assert "could not be parsed" in rec.turns[0].observation
    assert policy.seen[1].messages[-1]["content"].startswith("Your reply could not be parsed")
    assert rec.turns[1].exit_code == 3 and "hi" in rec.turns[1].observation
    assert rec.status is EpisodeStatus.VERIFIED_FAIL and rec.passed is False


def test_turn_cap_still_runs_the_verifier(tasks, layout):
    policy = Replies(["THOUGHT: a\nCOMMAND:\n```bash\ntrue\n```"] * 5)
    rec = _run(tasks["easy"], policy, layout, Budgets(max_turns=2))
    assert rec.status is EpisodeStatus.TURN_CAP and rec.num_turns == 2
    assert rec.passed is False and rec.verifier is not None


def test_context_overflow(tasks, layout):
    policy = Replies(["THOUGHT: a\nCOMMAND:\n```bash\nseq 1 400\n```"] * 5)
    rec = _run(tasks["easy"], policy, layout, Budgets(max_context_tokens=3000, max_output_tokens=64))
    assert rec.status is EpisodeStatus.CONTEXT_OVERFLOW
    assert rec.context_tokens + 64 > 3000 - len(layout.header_ids) - 1


def test_agent_timeout_kills_a_long_command(tasks, layout):
    policy = Replies(["THOUGHT: wait\nCOMMAND:\n```bash\nsleep 30\n```"])
    rec = _run(tasks["easy"], policy, layout, Budgets(wall_time_s=2.0))
    assert rec.status is EpisodeStatus.AGENT_TIMEOUT
    assert rec.turns[0].timed_out and rec.wall_s < 20


def test_infra_failure_when_setup_breaks(tasks, layout):
    class BrokenEnv(TaskEnv):
        def open(self, spec):
            raise OSError("bwrap: cannot create namespace")

    spec = EpisodeSpec(task=tasks["easy"], episode_id="x")
    rec = run_episode(spec, lambda r: Generation("THOUGHT: x\nDONE"), BrokenEnv("local"), layout)
    assert rec.status is EpisodeStatus.INFRA_FAILURE and "namespace" in rec.error
    assert not rec.status.counts


def test_active_summarisation_replaces_history_and_marks_boundary(tasks, layout):
    from tr.envs.tasks import load_suite

    task = next(t for t in load_suite() if t.id == "ft-patch-series")  # 4 turns
    policy = ScriptedPolicy([task])
    n = len(policy.commands[task.id])
    assert n >= 3
    prompt = len(layout.prompt_ids(SYSTEM_PROMPT, task.instruction))
    rec = _run(task, policy, layout, Budgets(summarise_at_tokens=prompt + 400,
                                             max_context_tokens=prompt + 8000, max_output_tokens=4096))
    assert rec.format_errors == 0
    assert rec.summaries >= 1, "context never reached the threshold: lower it"
    assert rec.status is EpisodeStatus.VERIFIED_PASS, rec.error
    assert [t.command for t in rec.turns if t.kind == "command"] == policy.commands[task.id]
    assert len([t for t in rec.turns if t.kind == "command"]) == n
    summary_turns = [t for t in rec.turns if t.kind == "summary"]
    assert all(t.window == i for i, t in enumerate(summary_turns))
    seqs = episode_to_sequences(rec, reward=1.0)
    assert len(seqs) == rec.summaries + 1
    assert rec.messages[1]["content"].startswith(task.instruction)  # history replaced


def test_snapshot_is_taken_before_the_verifier(tasks, layout):
    from tr.agent.rollout import discard_snapshot_ref

    task = tasks["easy"]
    rec = _run(task, ScriptedPolicy([task]), layout, snapshot_before_verify=True)
    try:
        assert rec.status is EpisodeStatus.VERIFIED_PASS and rec.snapshot_ref is not None
        import os
        assert os.path.isdir(rec.snapshot_ref["location"])
        # the verifier wrote /logs/verifier inside the sandbox; the snapshot predates it
        from tr.envs.backends import make_sandbox
        from tr.agent.rollout import snapshot_from_ref
        with make_sandbox("local") as box:
            box.start()
            box.restore(snapshot_from_ref(rec.snapshot_ref))
            res = box.run("test -e /logs/verifier/junit.xml && echo yes || echo no", timeout_s=10)
            assert res.output.strip() == "no"
    finally:
        discard_snapshot_ref(rec.snapshot_ref)


def test_cancel_event_stops_the_episode(tasks, layout):
    cancel = threading.Event()
    cancel.set()
    rec = _run(tasks["easy"], ScriptedPolicy([tasks["easy"]]), layout, cancel=cancel)
    assert rec.status is EpisodeStatus.CANCELLED and not rec.status.counts


@pytest.mark.parametrize("engine", ["episode", "reprefill"])
def test_model_policy_is_token_in_token_out(tasks, engine):
    """The untrained tiny model through the harness: the arrays hold exactly the sampled ids, and the
    stored behaviour logprobs equal a fresh forward pass over the training sequence (so the prompt
    the sampler saw is the sequence the trainer sees)."""
    import jax.numpy as jnp
    import numpy as np

    from tr.agent.policies import load_model_policy
    from tr.models.decoder import token_logprobs

    policy = load_model_policy("tiny", seed=0, sampling="train", engine=engine)  # behaviour = the model's
    sampled = []
    if engine == "episode":
        inner = policy.sampler.submit

        def spy(prompt, params, **kw):
            fut = inner(prompt, params, **kw)
            fut.add_done_callback(lambda f: sampled.append(list(f.result().token_ids)))
            return fut

        policy.sampler.submit = spy
    else:
        inner = policy.sampler.generate

        def spy(prompts, params, max_new_tokens=None):
            outs = inner(prompts, params, max_new_tokens)
            sampled.extend(list(c.token_ids) for c in outs)
            return outs

        policy.sampler.generate = spy
    budgets = policy.budgets(16, max_turns=2)
    rec = _run(tasks["easy"], policy, policy.layout, budgets)
    assert rec.status is EpisodeStatus.TURN_CAP and rec.format_errors == 2 and rec.passed is False
    actions = [s for s in rec.segments if s.kind == "action"]
    assert [s.tokens for s in actions] == sampled and all(len(t) <= 16 for t in sampled)
    (seq,) = episode_to_sequences(rec, reward=0.0)
    assert seq["tokens"][seq["actor_mask"]].tolist() == [t for s in sampled for t in s]
    retokenised = [t for s in actions for t in policy.layout.action_ids(
        policy.tokenizer.decode([i for i in s.tokens if i != policy.tokenizer.eos_id]))]
    assert retokenised != seq["tokens"][seq["actor_mask"]].tolist()  # random bytes do not round-trip
    model = __import__("flax").nnx.merge(policy.sampler.graphdef, policy.sampler.state)
    logp, _ = token_logprobs(model, jnp.asarray(seq["tokens"])[None])
    np.testing.assert_allclose(np.asarray(logp[0])[seq["actor_mask"]], seq["logprobs"][seq["actor_mask"]],
                               atol=2e-3)


@pytest.mark.parametrize("fixture", ["harbor-csv-total", "tb1-word-count"])
def test_scripted_policy_replays_external_layouts_as_one_turn(fixture, layout):
    import pathlib

    from tr.envs.tasks import load_task

    task = load_task(pathlib.Path(__file__).parent / "fixtures" / "tasks" / fixture)
    rec = _run(task, ScriptedPolicy([task]), layout)
    assert rec.status is EpisodeStatus.VERIFIED_PASS, (rec.error, rec.turns)
    assert [t.kind for t in rec.turns] == ["command", "done"]


def test_injected_mistakes_are_seeded_and_change_commands(tasks):
    from tr.agent.harness import GenerationRequest

    task = tasks["hard"]
    clean = ScriptedPolicy([task])
    n = len(clean.commands[task.id])

    def commands(policy, seed):
        out, msgs = [], [{"role": "system", "content": "s"}, {"role": "user", "content": task.instruction}]
        for turn in range(1, n + 1):
            req = GenerationRequest(messages=tuple(msgs), prompt_tokens=(), max_tokens=8192,
                                    task_id=task.id, seed=seed, turn=turn)
            text = policy.generate([req])[0].text
            out.append(parse_action(text).command)
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "exit_code: 0\nok"}]
        return out

    assert commands(clean, 0) == clean.commands[task.id]
    always = ScriptedPolicy([task], mistake_prob=1.0, seed=3)
    wrong = commands(always, 0)
    assert all(w != c for w, c in zip(wrong, clean.commands[task.id]))
    assert wrong == commands(ScriptedPolicy([task], mistake_prob=1.0, seed=3), 0)  # seeded
    half = [commands(ScriptedPolicy([task], mistake_prob=0.5, seed=1), s) for s in range(20)]
    n_wrong = sum(w != c for run in half for w, c in zip(run, clean.commands[task.id]))
    assert 0 < n_wrong < 20 * n


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _feed_progress(stream):
    from tr.agent.records import EpisodeRecord, TurnRecord
    from tr.agent.rollout import Progress

    prog = Progress(3, stream=stream, enabled=True, min_interval_s=0.0)
    turns = [TurnRecord(turn=1, kind="command", text="")]
    prog.update(EpisodeRecord(episode_id="a", task_id="t", status=EpisodeStatus.VERIFIED_PASS,
                              passed=True, turns=turns))
    prog.update(EpisodeRecord(episode_id="b", task_id="t", status=EpisodeStatus.INFRA_FAILURE))
    prog.update(EpisodeRecord(episode_id="c", task_id="t", status=EpisodeStatus.TURN_CAP, passed=False,
                              turns=turns * 2))
    return stream.getvalue()


def test_progress_line_reports_done_pass_rate_and_rate():
    lines = _feed_progress(_Terminal()).split("\r")
    assert "1/3 episodes" in lines[1] and "pass 100.0%" in lines[1]
    assert "3/3 episodes" in lines[-1] and "pass  50.0%" in lines[-1] and "infra 1" in lines[-1]
    assert "steps/s" in lines[-1] and lines[-1].endswith("\n")


def test_progress_in_a_log_file_writes_whole_lines_not_carriage_returns():
    text = _feed_progress(io.StringIO())
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert "1/3 episodes" in lines[0] and "3/3 episodes" in lines[-1]


def test_output_budget_cuts_a_long_text_reply(tasks, layout):
    long_reply = "THOUGHT: " + "very " * 200 + "long\nCOMMAND:\n```bash\nls\n```"
    policy = Replies([long_reply])
    rec = _run(tasks["easy"], policy, layout, Budgets(max_output_tokens=50, max_turns=1))
    (turn,) = rec.turns
    assert turn.finish_reason == "length" and turn.output_tokens == 50 and turn.kind == "format_error"
    (action,) = [s for s in rec.segments if s.kind == "action"]
    assert action.tokens == layout.tokenizer.encode(long_reply)[:50]  # cut, not closed ...
    nxt = rec.segments[rec.segments.index(action) + 1]
    assert nxt.tokens[0] == layout.tokenizer.eos_id  # ... the observation closes it


@pytest.mark.parametrize("engine", ["episode", "reprefill"])
def test_context_budget_is_the_whole_model_context_only_over_an_episode_sampler(engine):
    """`budgets(context=)`: the batch sampler's prompt bucket (a power of two) caps its episodes;
    the episode sampler caches the model's whole `max_seq_len`, so an episode may use all of it."""
    from tr.agent.policies import load_model_policy

    policy = load_model_policy("tiny", seed=0, engine=engine)           # max_seq_len 4096
    assert policy.budgets(16).max_context_tokens == 2048 + 16             # the bucket rule
    assert policy.budgets(16, context=1000).max_context_tokens == 1000
    with pytest.raises(ValueError, match="context=50"):
        policy.budgets(16, context=50)
    if engine == "episode":
        assert policy.budgets(16, context=4096).max_context_tokens == 4096
    else:
        with pytest.raises(ValueError, match=r"context=4096: .*<= 2064"):
            policy.budgets(16, context=4096)


def test_an_episode_sampler_episode_runs_past_the_bucket_rule(tasks):
    """A real episode of the untrained tiny model (format errors every turn) over the episode
    sampler with a 3,000-token context: it ends by overflowing that, not the 2,064 of the
    bucket rule, so its later prompts were longer than any bucket would have allowed."""
    from tr.agent.policies import load_model_policy

    policy = load_model_policy("tiny", seed=0, sampling="train", engine="episode")
    # turns and tokens end it; the wall-clock cap is far above need (a loaded machine)
    budgets = policy.budgets(16, context=3000, max_turns=400, wall_time_s=1800.0)
    rec = _run(tasks["easy"], policy, policy.layout, budgets)
    assert rec.status is EpisodeStatus.CONTEXT_OVERFLOW, rec.status
    window = [s for s in rec.segments if s.window == rec.segments[-1].window]
    last = max(i for i, s in enumerate(window) if s.kind == "action")
    served = sum(len(s.tokens) for s in window[:last + 1])     # the last prompt + its generation
    assert 2064 < served <= 3000, served
