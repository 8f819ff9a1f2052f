"""The turn loop of one episode and the one action format every policy writes.

Action format (documented to the agent in :data:`SYSTEM_PROMPT`), exactly one of::

    THOUGHT: <a short thought>
    COMMAND:
    ```bash
    <one shell command>
    ```

    THOUGHT: <why the task is complete>
    DONE

A reply that matches neither is a *format error*: the agent gets an observation restating the
format (:func:`format_error_observation`), the turn is counted in the record, nothing crashes.

Each turn: budget checks (wall time, context, active summarisation), one generation, one command in
the sandbox's persistent shell, one observation.  When the agent says DONE or a budget runs out the
environment is optionally snapshotted (ReTerm: *before* the verifier, which may change it) and the
protected verifier judges the final state.  A verifier error (timeout, crash, no result, an
exception) is the agent's failed attempt unless the harness can show it is its own -- the sandbox
died, or the verifier fails on the untouched environment too (:meth:`EpisodeEnv.verifier_fault`);
``EpisodeRecord.verifier_fault`` records which.  The sandbox is closed on every path.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from tr.agent.records import EpisodeRecord, EpisodeStatus, TurnRecord
from tr.agent.transcript import ChatLayout, Generation, Transcript
from tr.envs.sandbox import SnapshotRefused

SYSTEM_PROMPT = """You are an autonomous agent working in a Linux shell (bash) to complete a task.
The working directory is /app. Each turn, reply in exactly this format:

THOUGHT: <one or two sentences: what you will do and why>
COMMAND:
```bash
<exactly one shell command>
```

The command runs in a persistent shell; you then see its exit code and output. When the task is
complete, reply instead:

THOUGHT: <why the task is complete>
DONE

Write nothing else. Hidden tests check the final state after you finish."""

FORMAT_REMINDER = """Your reply could not be parsed ({reason}). Reply in exactly this format:
THOUGHT: <short thought>
COMMAND:
```bash
<one shell command>
```
or, when the task is complete:
THOUGHT: <why>
DONE"""

SUMMARY_REQUEST = """Your context is nearly full. Write a concise summary of the work so far: what
the task is, what you have done, what you learned about the environment, and what remains. Reply
with the summary only (no command). It will replace the history."""

SUMMARY_INTRO = "Summary of your earlier turns (the history was replaced by this summary):"

RECOVERY_PROMPT = """The previous attempt failed. The environment is in the state it left. Inspect
the current state, diagnose what went wrong, repair it, and verify your work before finishing."""


# ----------------------------------------------------------------------------------------------
# The action format.

@dataclasses.dataclass(frozen=True)
class Action:
    """A parsed reply: ``kind`` is "command", "done" or "invalid" (then ``error`` says why)."""

    kind: str
    thought: str = ""
    command: str | None = None
    error: str | None = None


_THOUGHT = re.compile(r"\A\s*THOUGHT:[ \t]*(?P<thought>.*?)\s*(?=^COMMAND:|^DONE\b|\Z)",
                      re.S | re.M)
_FENCE = re.compile(r"^```[ \t]*(?:bash|sh|shell)?[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)


def parse_action(text: str) -> Action:
    """Parses one reply in the action format; never raises."""
    m = _THOUGHT.match(text)
    if not m:
        return Action("invalid", error="the reply must start with 'THOUGHT:'")
    thought = m.group("thought").strip()
    rest = text[m.end():].strip()
    if rest == "DONE":
        return Action("done", thought=thought)
    if not rest.startswith("COMMAND:"):
        return Action("invalid", thought=thought,
                      error="after the thought, write 'COMMAND:' and a ```bash block, or 'DONE'")
    body = rest[len("COMMAND:"):].lstrip(" \t")
    if not body.startswith("\n"):
        return Action("invalid", thought=thought, error="put the ```bash block on the line after 'COMMAND:'")
    body = body[1:]
    fences = list(_FENCE.finditer(body))
    if not fences:
        return Action("invalid", thought=thought, error="no ```bash ... ``` block after 'COMMAND:'")
    if len(fences) > 1:
        return Action("invalid", thought=thought, error="more than one command block; write exactly one")
    f = fences[0]
    if body[:f.start()].strip() or body[f.end():].strip():
        return Action("invalid", thought=thought, error="text outside the command block")
    command = f.group("body").strip("\n")
    if not command.strip():
        return Action("invalid", thought=thought, error="the command block is empty")
    return Action("command", thought=thought, command=command)


def format_action(thought: str, command: str | None) -> str:
    """The reply text for a thought and a command (None = DONE); ``parse_action`` inverts it."""
    thought = " ".join(thought.split()) or "Next step."
    if command is None:
        return f"THOUGHT: {thought}\nDONE"
    return f"THOUGHT: {thought}\nCOMMAND:\n```bash\n{command}\n```"


def format_error_observation(error: str) -> str:
    return FORMAT_REMINDER.format(reason=error)


def command_observation(output: str, exit_code: int | None, timed_out: bool, timeout_s: float) -> str:
    """What the agent sees after a command: the exit code line, then the (capped) output."""
    if timed_out:
        head = f"exit_code: none (the command timed out after {timeout_s:g}s and was killed)"
    elif exit_code is None:
        head = "exit_code: none (the command was killed)"
    else:
        head = f"exit_code: {exit_code}"
    return f"{head}\n{output if output.strip() else '(no output)'}"


# ----------------------------------------------------------------------------------------------
# Budgets, requests, environment hooks.

@dataclasses.dataclass(frozen=True)
class Budgets:
    """Per-episode limits.  ``max_turns`` / ``wall_time_s`` None = the task's own budgets.
    ``summarise_at_tokens`` None = no active summarisation (SPEC §6: 32k at paper scale).
    Defaults are the papers' (8,192 output tokens per turn, 65k context); a small model gets
    budgets that fit its sampler from ``ModelPolicy.budgets()``."""

    max_turns: int | None = None
    max_output_tokens: int = 8192
    max_context_tokens: int = 65_536
    wall_time_s: float | None = None
    command_timeout_s: float = 60.0
    summarise_at_tokens: int | None = None

    def __post_init__(self):
        for name in ("max_output_tokens", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"Budgets.{name}={getattr(self, name)} must be >= 1")
        if self.summarise_at_tokens is not None and self.summarise_at_tokens >= self.max_context_tokens:
            raise ValueError(f"Budgets.summarise_at_tokens={self.summarise_at_tokens} must be below "
                             f"max_context_tokens={self.max_context_tokens}")


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One generation: the chat view (text policies) and the exact token context (token policies)."""

    messages: tuple[dict, ...]
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    task_id: str = ""
    episode_id: str = ""
    seed: int = 0
    turn: int = 0
    purpose: str = "action"  # "action" | "summary"


class Cancelled(Exception):
    """Raised inside an episode when the engine cancels it (over-sampling)."""


@dataclasses.dataclass
class EpisodeSpec:
    """What to run: a task (tr.envs.tasks.Task), identity, and for a recovery rollout the failed
    attempt it continues from (``parent`` record holding h_f, restored from ``parent.snapshot_ref``)
    and how much of h_f it sees: ``history_turns`` N > 0 = the task prompt and the last N turns
    (:func:`tr.agent.transcript.inherited_history`), 0 = the whole last window."""

    task: Any
    episode_id: str
    group_id: str = ""
    rollout_index: int = 0
    seed: int = 0
    parent: EpisodeRecord | None = None
    recovery_prompt: str = RECOVERY_PROMPT
    history_turns: int = 0

    def __post_init__(self):
        if self.history_turns < 0:
            raise ValueError(f"EpisodeSpec.history_turns={self.history_turns} must be >= 0")

    @property
    def kind(self) -> str:
        return "original" if self.parent is None else "recovery"


class EpisodeEnv(Protocol):
    """The environment side of an episode (implemented over sandboxes + tasks in rollout.py)."""

    def open(self, spec: EpisodeSpec) -> Any: ...          # a started sandbox, state laid down

    def snapshot(self, spec: EpisodeSpec, sandbox: Any) -> dict: ...

    def verify(self, spec: EpisodeSpec, sandbox: Any) -> Any: ...   # VerifierResult

    def verifier_fault(self, spec: EpisodeSpec, sandbox: Any) -> tuple[str, str]: ...
    # after a verifier error: ("agent" | "harness", why) -- see run_episode

    def close(self, sandbox: Any) -> None: ...


class InfraError(Exception):
    """The sandbox or the verifier failed (not the agent's doing)."""


# ----------------------------------------------------------------------------------------------
# The loop.

def run_episode(
    spec: EpisodeSpec,
    generate: Callable[[GenerationRequest], Generation],
    env: EpisodeEnv,
    layout: ChatLayout,
    budgets: Budgets = Budgets(),
    *,
    snapshot_before_verify: bool = False,
    cancel: threading.Event | None = None,
    policy_name: str = "",
    system_prompt: str = SYSTEM_PROMPT,
) -> EpisodeRecord:
    """Runs one episode to its end and returns its record (never raises for agent or infra faults;
    raises :class:`Cancelled` only through ``generate`` — caught here, status CANCELLED)."""
    task = spec.task
    t_start = time.monotonic()
    max_turns = budgets.max_turns if budgets.max_turns is not None else task.budgets.max_turns
    wall = budgets.wall_time_s if budgets.wall_time_s is not None else task.budgets.agent_timeout_s
    rec = EpisodeRecord(
        episode_id=spec.episode_id, task_id=task.id, family=task.family, tier=task.tier,
        group_id=spec.group_id, rollout_index=spec.rollout_index, kind=spec.kind,
        policy=policy_name, seed=spec.seed,
        parent_episode_id=None if spec.parent is None else spec.parent.episode_id,
        recovery_prompt=None if spec.parent is None else spec.recovery_prompt,
        history_turns=0 if spec.parent is None else spec.history_turns)
    tr = Transcript(layout)
    sandbox = None
    done = False
    status: EpisodeStatus | None = None
    first_turn = 1
    try:
        if spec.parent is not None:
            tr.inherit(spec.parent, spec.history_turns)
            first_turn = 1 + max((t.turn for t in spec.parent.turns), default=0)
            tr.add_user(spec.recovery_prompt, turn=first_turn - 1)
        else:
            tr.start(system_prompt, task.instruction)
        t0 = time.monotonic()
        try:
            sandbox = env.open(spec)
        except Exception as e:  # noqa: BLE001 — any sandbox/setup error is an infra failure
            raise InfraError(f"environment setup failed: {type(e).__name__}: {e}") from e
        rec.setup_s = time.monotonic() - t0

        turn = first_turn - 1
        taken = 0
        just_summarised = False
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            if taken >= max_turns:
                status = EpisodeStatus.TURN_CAP
                break
            if time.monotonic() - t_start >= wall:
                status = EpisodeStatus.AGENT_TIMEOUT
                break
            turn += 1
            if (budgets.summarise_at_tokens is not None and not just_summarised
                    and tr.context_len() >= budgets.summarise_at_tokens):
                if not _summarise(spec, tr, rec, generate, budgets, turn, system_prompt):
                    status = EpisodeStatus.CONTEXT_OVERFLOW
                    break
                just_summarised = True  # at most one summary between two actions
                turn += 1
            if tr.context_len() + len(layout.header_ids) + budgets.max_output_tokens > budgets.max_context_tokens:
                status = EpisodeStatus.CONTEXT_OVERFLOW
                break
            gen, gen_s = _generate(spec, tr, generate, budgets, turn, "action")
            ids = tr.add_generation(gen, turn)
            taken += 1
            just_summarised = False
            action = parse_action(gen.text)
            tr_rec = TurnRecord(turn=turn, kind=action.kind, text=gen.text, thought=action.thought,
                                command=action.command, finish_reason=gen.finish_reason,
                                output_tokens=len(ids), gen_s=gen_s, window=tr.window)
            rec.gen_s += gen_s
            rec.turns.append(tr_rec)
            if action.kind == "done":
                done = True
                break
            if action.kind == "invalid":
                tr_rec.kind = "format_error"
                tr_rec.format_error = action.error
                tr_rec.observation = format_error_observation(action.error)
                rec.format_errors += 1
            else:
                remaining = max(1.0, wall - (time.monotonic() - t_start))
                timeout = min(budgets.command_timeout_s, remaining)
                t0 = time.monotonic()
                try:
                    res = sandbox.run(action.command, timeout_s=timeout)
                except Exception as e:  # noqa: BLE001
                    raise InfraError(f"sandbox.run failed: {type(e).__name__}: {e}") from e
                tr_rec.env_s = time.monotonic() - t0
                rec.env_s += tr_rec.env_s
                tr_rec.exit_code, tr_rec.timed_out, tr_rec.truncated = res.exit_code, res.timed_out, res.truncated
                tr_rec.observation = command_observation(res.output, res.exit_code, res.timed_out, timeout)
            tr.add_user(tr_rec.observation, turn)

        if cancel is not None and cancel.is_set():
            raise Cancelled()
        refused = None
        if snapshot_before_verify:
            t0 = time.monotonic()
            try:
                rec.snapshot_ref = env.snapshot(spec, sandbox)
            except SnapshotRefused as e:  # the agent's state is over the snapshot's bounds
                refused = f"snapshot refused: {e}"
            except Exception as e:  # noqa: BLE001
                raise InfraError(f"snapshot failed: {type(e).__name__}: {e}") from e
            rec.env_s += time.monotonic() - t0
        t0 = time.monotonic()
        if refused is not None:  # agent-caused: a failure, never verified (nor dropped as infra)
            vr, failure = None, refused
            rec.error = f"{refused} (counted as the agent's failure)"
        else:
            try:
                vr = env.verify(spec, sandbox)
                failure = None if vr.error is None else \
                    f"verifier error: {vr.error}: {getattr(vr, 'error_detail', '')}".rstrip(": ")
            except Exception as e:  # noqa: BLE001 — judged below, like an error the verifier reports
                vr, failure = None, f"verifier failed: {type(e).__name__}: {e}"
        if failure is not None and refused is None:
            rec.verifier_fault, why = _judge_verifier_error(env, spec, sandbox)
            if rec.verifier_fault == "harness":
                raise InfraError(f"{failure} ({why})")
            rec.error = f"{failure} (counted as the agent's failure: {why})"
        rec.verify_s = time.monotonic() - t0
        if vr is not None:
            rec.verifier = vr.to_dict()
            rec.matched, rec.executed = float(vr.matched), int(vr.executed)
        else:
            rec.matched, rec.executed = 0.0, 0
        rec.passed = failure is None and bool(vr.strict_pass)
        if done:
            status = EpisodeStatus.VERIFIED_PASS if rec.passed else EpisodeStatus.VERIFIED_FAIL
        rec.status = status
    except Cancelled:
        rec.status = EpisodeStatus.CANCELLED
        rec.error = "cancelled by the engine"
    except InfraError as e:
        rec.status = EpisodeStatus.INFRA_FAILURE
        rec.error = str(e)
        rec.passed = None
    except Exception as e:  # noqa: BLE001 — a bug in a policy: recorded as infra, with the trace
        rec.status = EpisodeStatus.INFRA_FAILURE
        rec.error = f"unexpected {type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
        rec.passed = None
    finally:
        if sandbox is not None:
            try:
                env.close(sandbox)
            except Exception as e:  # noqa: BLE001
                rec.error = (rec.error or "") + f"; close failed: {e}"
        rec.segments = tr.segments
        rec.messages = tr.messages
        rec.context_tokens = tr.context_len()
        rec.wall_s = time.monotonic() - t_start
        rec.finished_at = time.time()
    return rec


def _judge_verifier_error(env, spec, sandbox) -> tuple[str, str]:
    """Whose fault a verifier error is: the harness's only when it can show it (the sandbox died,
    or a canary verification of the untouched environment fails too); otherwise the agent's --
    it can make the verifier time out, crash or find no result at will (fill the disk, turn the
    answer into a FIFO, ``chmod 000 /logs``), and an error that were not counted would turn its
    likely failures into "not counted"."""
    try:
        return env.verifier_fault(spec, sandbox)
    except Exception as e:  # noqa: BLE001 — the judge itself broke: the harness's fault
        return "harness", f"judging the verifier error failed: {type(e).__name__}: {e}"


def _generate(spec, tr: Transcript, generate, budgets: Budgets, turn: int, purpose: str):
    prompt = tr.prompt_ids()
    req = GenerationRequest(messages=tuple(tr.messages), prompt_tokens=tuple(prompt),
                            max_tokens=budgets.max_output_tokens, task_id=spec.task.id,
                            episode_id=spec.episode_id, seed=spec.seed, turn=turn, purpose=purpose)
    t0 = time.monotonic()
    gen = generate(req)
    gen_s = time.monotonic() - t0
    return _cap_output(gen, tr.layout, budgets.max_output_tokens), gen_s


def _cap_output(gen: Generation, layout: ChatLayout, cap: int) -> Generation:
    """Enforces the per-turn output budget on text replies (token replies are capped by the
    sampler): a reply over ``cap`` tokens is cut to ``cap`` and marked ``finish_reason='length'``."""
    if gen.tokens is not None:
        if len(gen.tokens) > cap:
            raise ValueError(f"policy returned {len(gen.tokens)} tokens > max_tokens={cap}")
        return gen
    ids = layout.tokenizer.encode(gen.text)
    if len(ids) + 1 <= cap:
        return gen
    ids = ids[:cap]
    return Generation(text=layout.tokenizer.decode(ids), tokens=ids, logprobs=None,
                      finish_reason="length", source=gen.source)


def _summarise(spec, tr: Transcript, rec: EpisodeRecord, generate, budgets, turn, system_prompt) -> bool:
    """Active summarisation: ask for a summary, then replace the history by it (new window)."""
    tr.add_user(SUMMARY_REQUEST, turn=turn - 1, kind="summary_request")
    if tr.context_len() + len(tr.layout.header_ids) + budgets.max_output_tokens > budgets.max_context_tokens:
        return False
    gen, gen_s = _generate(spec, tr, generate, budgets, turn, "summary")
    tr.add_generation(gen, turn, kind="summary")
    rec.gen_s += gen_s
    rec.summaries += 1
    rec.turns.append(TurnRecord(turn=turn, kind="summary", text=gen.text, gen_s=gen_s,
                                finish_reason=gen.finish_reason, window=tr.window))
    summary = gen.text.strip()
    tr.new_window(system_prompt, f"{spec.task.instruction}\n\n{SUMMARY_INTRO}\n{summary}")
    return True
