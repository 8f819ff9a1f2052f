"""ReTerm data and the recovery queue (issue 15, SPEC §6): learn to recover from one's own failures.

    failures   a named actor attempts tasks N times with a pre-verifier snapshot; each failed
               attempt keeps its history h_f (the record) and its persisted snapshot s_f
    teacher    restores s_f, sees the task, h_f (all of its last window, or with
               ``history_turns`` N > 0 the task prompt and only its last N turns: every recovery
               -- teacher rows, Recovery@k, ReTerm-GRPO groups -- sees the same cut, see
               :func:`tr.agent.transcript.inherited_history`) and the generation-time recovery
               prompt
               (:data:`TEACHER_RECOVERY_PROMPT`: inspect -> diagnose -> plan and fix -> verify), is
               told only that the attempt failed (never test feedback), continues
    filters    verifier (must pass) and format (well-formed turns) by rule; compliance (deletes an
               input, reads the tests, touches harness paths) and efficiency (repeated identical
               failing commands, loops) flagged by rules, then an optional judge keeps or rejects
               each flagged one (no judge: flagged = rejected); every rejection is counted
    dataset    JSONL shards of rows (x, h_f, r, y + token ids, teacher-only loss mask) whose input
               carries the *condensed* recovery prompt r (:data:`tr.agent.harness.RECOVERY_PROMPT`),
               not the generation-time workflow (the paper strips it deliberately)
    queue      :class:`RecoveryQueue`: front insert, front-first (or uniform) sampling, capacity K,
               the oldest evicted with its snapshot discarded
    metrics    rule-based error categories of a failure, Recovery@k on fixed failure states

No JAX here: the policies are anything :mod:`tr.agent.policies` accepts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tr.agent.harness import RECOVERY_PROMPT, format_action
from tr.agent.records import EpisodeRecord, EpisodeStatus, episode_to_sequences
from tr.agent.rollout import (
    RolloutConfig, discard_snapshot_ref, group_specs, recovery_specs, run_rollouts,
)
from tr.agent.harness import GenerationRequest
from tr.agent.http_policy import HttpPolicy
from tr.agent.policies import solution_commands
from tr.agent.transcript import ChatLayout, Generation, inherited_history
from tr.envs import gym

# The generation-time prompt (the teacher's workflow); the SFT input and recovery rollouts carry
# the condensed r = RECOVERY_PROMPT instead.
TEACHER_RECOVERY_PROMPT = """The previous attempt failed. The environment is in the state it left;
you are not told why it failed. Follow this recovery workflow:
1. Inspect the inherited state (list and read the files involved) before changing anything.
2. Diagnose what went wrong in the earlier turns.
3. Plan the repair, then carry it out, one command per turn.
4. Verify the result yourself, then finish with DONE."""

CONDENSED_PROMPT = RECOVERY_PROMPT
FILTERS = ("verifier", "format", "compliance", "efficiency")
ERROR_CATEGORIES = ("planning", "tool_use", "implementation", "verification", "resource_management")
INSPECT_COMMAND = "find /app -maxdepth 2 | sort | head -n 30"


# ----------------------------------------------------------------------------------------------
# Failure collection.

def collect_failures(policy, tasks: Sequence, attempts: int, layout: ChatLayout,
                     config: RolloutConfig, *, seed: int = 0, prefix: str = "fail"):
    """``attempts`` rollouts of every task with a pre-verifier snapshot; returns ``(failures,
    stats)``: the counted failed records, each with ``snapshot_ref`` (s_f) and its history (h_f).
    Snapshots of passes and of uncounted episodes are discarded here."""
    config = dataclasses.replace(config, snapshot_before_verify=True)
    out = run_rollouts(group_specs(tasks, attempts, seed=seed, prefix=prefix), policy, layout, config)
    failures, passed, uncounted = [], 0, 0
    for rec in sorted(out.records, key=lambda r: r.episode_id):
        if rec.status.counts and not rec.passed and rec.snapshot_ref is not None:
            failures.append(rec)
            continue
        passed += int(bool(rec.passed))
        uncounted += int(not rec.status.counts)
        discard_snapshot_ref(rec.snapshot_ref)
    for rec in out.cancelled:
        discard_snapshot_ref(rec.snapshot_ref)
    return failures, {"episodes": len(out.records), "failures": len(failures), "passed": passed,
                      "uncounted": uncounted, "wall_s": out.wall_s}


def spread_by_family(failures: Sequence[EpisodeRecord],
                     n: int) -> tuple[list[EpisodeRecord], list[EpisodeRecord]]:
    """``(kept, rest)``: ``n`` failures taken round-robin over their families (sorted), each
    family's in the given order, so a fixed set of states covers every family that failed (the
    first ``n`` by episode id are the alphabetically first families only)."""
    by_family: dict[str, list[EpisodeRecord]] = {}
    for f in failures:
        by_family.setdefault(f.family, []).append(f)
    queues = [by_family[k] for k in sorted(by_family)]
    kept, i = [], 0
    while len(kept) < n and any(queues):
        queue = queues[i % len(queues)]
        if queue:
            kept.append(queue.pop(0))
        i += 1
    chosen = {id(f) for f in kept}
    return kept, [f for f in failures if id(f) not in chosen]


def discard_failures(failures: Sequence[EpisodeRecord]) -> None:
    for rec in failures:
        discard_snapshot_ref(rec.snapshot_ref)


# ----------------------------------------------------------------------------------------------
# Teachers.

def _after_recovery_prompt(messages: Sequence[dict]) -> int:
    """Assistant replies after the last recovery prompt (the start of this recovery)."""
    start = 0
    for i, m in enumerate(messages):
        if m["role"] == "user" and m["content"].startswith("The previous attempt failed"):
            start = i
    return sum(1 for m in messages[start + 1:] if m["role"] == "assistant")


class EmbeddedTeacher:
    """A CPU teacher that really recovers from the state it finds: one inspecting command, then
    on a gym task the family's ``repair_commands`` (they reach the goal from any state the
    family's mistakes leave), on any other task its reference solution replayed from s_f, one
    command per turn, then DONE.  It reads neither the verifier nor the tests.

    ``thoughts``: the THOUGHT lines of (the inspecting turn, a repair turn, the DONE turn);
    ``{k}``/``{n}`` in the repair one are the step and the count.  A student trained on the
    teacher's tokens learns these words too: give it the phrases it already uses (the gym's Base
    says "Next step." / "The task is complete."), else SFT teaches a new prose along with the
    recovery, and a tiny model composes the two (it learned "THOUGHT: The" from the teacher's
    first line and finished it with its own DONE thought on every fresh task)."""

    DEFAULT_THOUGHTS = ("The last attempt failed; inspect the state it left.",
                        "Repair step {k} of {n}.", "Repaired and checked; the task is complete.")

    def __init__(self, tasks: Sequence, *, name: str = "embedded-teacher",
                 thoughts: Sequence[str] = DEFAULT_THOUGHTS):
        if len(thoughts) != 3:
            raise ValueError(f"{name}: thoughts needs 3 lines (inspect, repair, done), got "
                             f"{len(thoughts)}")
        self.name = name
        self.thoughts = tuple(thoughts)
        self.plans = {t.id: self.plan(t) for t in tasks}

    @staticmethod
    def plan(task) -> list[str]:
        if task.family in gym.FAMILIES:
            try:
                gym.task_seed(task)
                return [INSPECT_COMMAND] + list(gym.repair_commands(task))
            except (ValueError, KeyError):
                pass
        return [INSPECT_COMMAND] + solution_commands(task)

    def check_request(self, req) -> None:
        """Raises ValueError for a request naming no task this teacher has a plan for."""
        if req.task_id not in self.plans:
            raise ValueError(f"{self.name}: no plan for task {req.task_id!r}")

    def generate(self, requests):
        out = []
        for req in requests:
            self.check_request(req)
            plan = self.plans[req.task_id]
            k = _after_recovery_prompt(req.messages)
            inspect, repair, done = self.thoughts
            if k == 0:
                text = format_action(inspect, plan[0])
            elif k < len(plan):
                text = format_action(repair.format(k=k, n=len(plan) - 1), plan[k])
            else:
                text = format_action(done, None)
            out.append(Generation(text=text, source="teacher"))
        return out


def make_teacher(kind: str, tasks: Sequence = (), **http):
    """``embedded`` (:class:`EmbeddedTeacher`) or ``http`` (any OpenAI-compatible endpoint through
    :class:`tr.agent.http_policy.HttpPolicy`: ``base_url``, ``model``, ...; its turns are
    ``teacher`` tokens)."""
    if kind == "embedded":
        return EmbeddedTeacher(tasks)
    if kind == "http":
        return HttpPolicy(source="teacher", **http)
    raise ValueError(f"teacher kind {kind!r}: expected 'embedded' or 'http'")


def teacher_recoveries(teacher, failures: Sequence[EpisodeRecord], tasks_by_id: dict,
                       layout: ChatLayout, config: RolloutConfig, *, seed: int = 0,
                       prompt: str = TEACHER_RECOVERY_PROMPT,
                       history_turns: int = 0) -> list[EpisodeRecord]:
    """One teacher continuation per failure from its restored s_f (generation-time prompt), seeing
    the last ``history_turns`` turns of h_f (0: all)."""
    specs = []
    for f in failures:
        specs += recovery_specs(tasks_by_id[f.task_id], f, 1, seed=seed, recovery_prompt=prompt,
                                history_turns=history_turns)
    config = dataclasses.replace(config, snapshot_before_verify=False)
    out = run_rollouts(specs, teacher, layout, config)
    return sorted(out.records, key=lambda r: r.episode_id)


# ----------------------------------------------------------------------------------------------
# Filters.

_READS_TESTS = re.compile(r"(/tests\b|test_checks|/logs/verifier|/opt/tr\b|junit)")
_RM = re.compile(r"(?:^|[;&|]\s*)(?:rm|shred|truncate)\b([^;&|]*)")
_INPUT_PATH = re.compile(r"/app/[\w./-]+")


def format_ok(rec: EpisodeRecord) -> bool:
    """Every turn of the recovery parsed (no format error), and it ended by saying DONE."""
    return (rec.format_errors == 0 and all(t.kind in ("command", "done") for t in rec.turns)
            and bool(rec.turns) and rec.turns[-1].kind == "done")


def compliance_flags(rec: EpisodeRecord, instruction: str) -> list[str]:
    """Rule flags for acting against the task's constraints: reading the tests or the harness's
    paths, deleting a file the instruction names (an input), ``rm -rf`` of /app itself."""
    flags = []
    named = {p.rstrip(".,") for p in _INPUT_PATH.findall(instruction)}
    for t in rec.turns:
        if not t.command:
            continue
        if _READS_TESTS.search(t.command):
            flags.append(f"turn {t.turn}: reads test/harness paths")
        for m in _RM.finditer(t.command):
            args = m.group(1)
            if re.search(r"(^|\s)/app/?(\s|$)", args) or re.search(r"(^|\s)/(\s|$)", args):
                flags.append(f"turn {t.turn}: removes the whole workspace")
            for p in named:
                rel = p[len("/app/"):]
                if p in args or re.search(rf"(^|\s){re.escape(rel)}(\s|$)", args):
                    flags.append(f"turn {t.turn}: deletes {p}, named by the task")
    return flags


def efficiency_flags(rec: EpisodeRecord, *, max_repeats: int = 3) -> list[str]:
    """Rule flags for wasted turns: an identical command that failed run again, or any identical
    command run ``max_repeats`` times (a loop)."""
    flags, failed, seen = [], set(), {}
    for t in rec.turns:
        if not t.command:
            continue
        c = " ".join(t.command.split())
        if c in failed:
            flags.append(f"turn {t.turn}: repeats a failing command")
        seen[c] = seen.get(c, 0) + 1
        if seen[c] == max_repeats:
            flags.append(f"turn {t.turn}: the same command {max_repeats} times")
        if t.timed_out or (t.exit_code is not None and t.exit_code != 0):
            failed.add(c)
    return flags


JUDGE_PROMPT = """You review one recovery trajectory of a terminal agent for the problem named
below. Task: {task}
Problem flagged by a rule: {flags}
The agent's commands, in order:
{commands}
Reply with exactly one word: KEEP if the flag is a false alarm, REJECT if the trajectory really
{what}."""


class HttpJudge:
    """The optional LLM judge of flagged recoveries through an OpenAI-compatible policy (any
    object with ``generate``, e.g. :class:`tr.agent.http_policy.HttpPolicy`)."""

    WHAT = {"compliance": "acts against the task's constraints",
            "efficiency": "wastes turns on repeated or looping commands"}

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, filter_name: str, rec: EpisodeRecord, instruction: str,
                 flags: list[str]) -> bool:

        commands = "\n".join(f"{t.turn}: {t.command}" for t in rec.turns if t.command)
        text = JUDGE_PROMPT.format(task=instruction, flags="; ".join(flags), commands=commands,
                                   what=self.WHAT[filter_name])
        req = GenerationRequest(messages=({"role": "user", "content": text},), prompt_tokens=(),
                                max_tokens=8,
                                task_id=rec.task_id, episode_id=rec.episode_id, seed=0, turn=0,
                                purpose="judge")
        reply = self.policy.generate([req])[0].text.strip().upper()
        return reply.startswith("KEEP")


def filter_recovery(rec: EpisodeRecord, instruction: str,
                    judge: Callable | None = None) -> tuple[str | None, dict]:
    """The first filter that rejects ``rec`` (None = kept) and every rule flag raised."""
    flags = {"compliance": [], "efficiency": []}
    if not (rec.status.counts and rec.passed):
        return "verifier", flags
    if not format_ok(rec):
        return "format", flags
    flags["compliance"] = compliance_flags(rec, instruction)
    flags["efficiency"] = efficiency_flags(rec)
    for name in ("compliance", "efficiency"):
        if flags[name] and (judge is None or not judge(name, rec, instruction, flags[name])):
            return name, flags
    return None, flags


# ----------------------------------------------------------------------------------------------
# The dataset: (x, h_f, r, y) rows with the condensed r.

def condense(rec: EpisodeRecord, layout: ChatLayout, r: str = CONDENSED_PROMPT) -> EpisodeRecord:
    """A copy of a recovery record whose generation-time prompt is replaced by ``r``: the message
    and its token segment (the env segment that opens with the prompt; the parent's history may
    end on an action or on an observation, e.g. at a turn cap)."""
    if rec.recovery_prompt is None:
        raise ValueError(f"episode {rec.episode_id}: not a recovery episode")
    out = EpisodeRecord.from_json(json.loads(json.dumps(rec.to_json())))
    found = False
    for seg in out.segments:     # the env segment that opens with the generation-time prompt
        if seg.source != "env" or seg.kind != "observation":
            continue
        for close in (True, False):
            old = layout.user_ids(rec.recovery_prompt, close_action=close)
            if seg.tokens[:len(old)] == old:
                seg.tokens = layout.user_ids(r, close_action=close) + seg.tokens[len(old):]
                found = True
                break
        if found:
            break
    if not found:
        raise ValueError(f"episode {rec.episode_id}: no segment holds its recovery prompt")
    for m in out.messages:
        if m["role"] == "user" and m["content"] == rec.recovery_prompt:
            m["content"] = r
    out.recovery_prompt = r
    return out


def dataset_row(rec: EpisodeRecord, parent: EpisodeRecord, instruction: str,
                layout: ChatLayout, r: str = CONDENSED_PROMPT) -> dict:
    """One JSONL row: x (task), h_f (the failed attempt's messages the recovery saw: from the task
    message on, capped as ``rec.history_turns`` says), r, y (the teacher's messages), and the token
    view of that same context (teacher tokens only in the loss)."""
    short = condense(rec, layout, r)
    (seq,) = episode_to_sequences(short, 1.0, loss_sources=("teacher",))
    _, h_f = inherited_history(parent, layout, rec.history_turns)
    if short.messages[:len(h_f)] != h_f:
        raise ValueError(f"episode {rec.episode_id}: its inherited messages are not those of "
                         f"{parent.episode_id} with history_turns={rec.history_turns}")
    n_hf = len(h_f)
    return {"task_id": rec.task_id, "family": rec.family, "episode_id": rec.episode_id,
            "parent_episode_id": parent.episode_id, "x": instruction,
            "h_f": h_f[1:], "r": r, "y": short.messages[n_hf + 1:],
            "history_turns": rec.history_turns,
            "tokens": seq["tokens"].tolist(), "loss_mask": seq["loss_mask"].astype(int).tolist(),
            "actor_mask": seq["actor_mask"].astype(int).tolist()}


def build_dataset(failures: Sequence[EpisodeRecord], recoveries: Sequence[EpisodeRecord],
                  tasks_by_id: dict, layout: ChatLayout, *, judge: Callable | None = None,
                  r: str = CONDENSED_PROMPT) -> tuple[list[dict], dict]:
    """Filters the teacher's recoveries; returns ``(rows, counts)`` with ``rejected_by`` per
    filter (each recovery counted by the first filter that rejects it)."""
    parents = {f.episode_id: f for f in failures}
    rejected = dict.fromkeys(FILTERS, 0)
    flagged = {"compliance": 0, "efficiency": 0}
    rows = []
    for rec in recoveries:
        instruction = tasks_by_id[rec.task_id].instruction
        why, flags = filter_recovery(rec, instruction, judge)
        for k in flagged:
            flagged[k] += int(bool(flags[k]))
        if why is not None:
            rejected[why] += 1
            continue
        rows.append(dataset_row(rec, parents[rec.parent_episode_id], instruction, layout, r))
    return rows, {"failures": len(failures), "recoveries": len(recoveries), "kept": len(rows),
                  "rejected_by": rejected, "flagged": flagged}


def write_shards(rows: Sequence[dict], directory, *, shard_size: int = 256) -> list[str]:
    """``rows`` as JSONL shards ``recoveries-00000.jsonl``, ... (atomic writes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(0, max(len(rows), 1), shard_size):
        path = directory / f"recoveries-{i // shard_size:05d}.jsonl"
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows[i:i + shard_size]:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
        paths.append(str(path))
    return paths


def read_shards(paths: Sequence) -> list[dict]:
    """Rows of JSONL shards; a bad line raises naming the file and line."""
    rows = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{n}: not valid JSON ({e.msg})") from None
                missing = [k for k in ("x", "h_f", "r", "y", "tokens", "loss_mask") if k not in row]
                if missing:
                    raise ValueError(f"{p}:{n}: missing field(s) {missing}")
                rows.append(row)
    return rows


def sft_sequences(rows: Sequence[dict]) -> list[dict]:
    """Rows as ``{tokens, loss_mask}`` numpy sequences (teacher tokens only in the loss)."""
    import numpy as np

    return [{"tokens": np.asarray(r["tokens"], np.int32),
             "loss_mask": np.asarray(r["loss_mask"], bool)} for r in rows]


# ----------------------------------------------------------------------------------------------
# The recovery queue.

class RecoveryQueue:
    """Failures ``(x, h_f, s_f)`` waiting to become recovery groups (SPEC §6).

    ``push`` inserts at the front; when more than ``capacity`` are held the oldest (the back) is
    evicted and its snapshot discarded.  ``pop(n)`` takes ``n`` items: the front first
    (``sampling='front'``, the paper's) or uniformly at random (``'uniform'``, the queue variant).
    An item taken is the caller's (it discards the snapshot when done, :func:`release`);
    ``close`` discards every snapshot still held."""

    def __init__(self, capacity: int, *, sampling: str = "front", seed: int = 0,
                 discard: Callable[[dict | None], None] = discard_snapshot_ref):
        if capacity < 1:
            raise ValueError(f"recovery queue capacity={capacity} must be >= 1")
        if sampling not in ("front", "uniform"):
            raise ValueError(f"recovery queue sampling={sampling!r}: expected 'front' or 'uniform'")
        self.capacity, self.sampling = capacity, sampling
        self.rng = random.Random(seed)
        self.items: list[EpisodeRecord] = []
        self.discard = discard
        self.inserted = self.evicted = self.sampled = 0

    def __len__(self) -> int:
        return len(self.items)

    def push(self, failure: EpisodeRecord) -> None:
        if failure.snapshot_ref is None:
            raise ValueError(f"episode {failure.episode_id}: no snapshot; cannot queue it")
        self.items.insert(0, failure)
        self.inserted += 1
        while len(self.items) > self.capacity:
            old = self.items.pop()
            self.evicted += 1
            self.discard(old.snapshot_ref)

    def pop(self, n: int) -> list[EpisodeRecord]:
        n = min(n, len(self.items))
        if self.sampling == "front":
            out, self.items = self.items[:n], self.items[n:]
        else:
            picks = sorted(self.rng.sample(range(len(self.items)), n))
            out = [self.items[i] for i in picks]
            self.items = [x for i, x in enumerate(self.items) if i not in set(picks)]
        self.sampled += len(out)
        return out

    def release(self, items: Sequence[EpisodeRecord]) -> None:
        for it in items:
            self.discard(it.snapshot_ref)

    def close(self) -> None:
        self.release(self.items)
        self.items = []

    def stats(self) -> dict:
        return {"capacity": self.capacity, "sampling": self.sampling, "inserted": self.inserted,
                "evicted": self.evicted, "sampled": self.sampled, "held": len(self.items)}


def failure_of_group(records: Sequence[EpisodeRecord], rng: random.Random) -> EpisodeRecord | None:
    """One failed rollout of an original group (with a snapshot), chosen at random, or None."""
    failed = [r for r in records if r.status.counts and not r.passed and r.snapshot_ref]
    return rng.choice(failed) if failed else None


# ----------------------------------------------------------------------------------------------
# Error categories and Recovery@k.

_NOT_FOUND = (127, 126)


def error_category(rec: EpisodeRecord) -> str:
    """Rule-based label of a failed attempt (first that applies):

    resource_management  a budget ran out (turns, wall time, context) or a command timed out
    tool_use             a command not found / not executable (exit 126/127) or a format error
    implementation       a command failed (any other non-zero exit)
    verification         said DONE without a read-only check after its last change
    planning             every command succeeded and it checked, but the outcome was wrong
    """
    if rec.status in (EpisodeStatus.TURN_CAP, EpisodeStatus.AGENT_TIMEOUT,
                      EpisodeStatus.CONTEXT_OVERFLOW) or any(t.timed_out for t in rec.turns):
        return "resource_management"
    cmds = [t for t in rec.turns if t.command]
    if rec.format_errors or any(t.exit_code in _NOT_FOUND for t in cmds):
        return "tool_use"
    if any(t.exit_code not in (0, None) for t in cmds):
        return "implementation"
    readonly = re.compile(r"^\s*(ls|cat|head|tail|test|\[|diff|grep|wc|stat|find)\b")
    if not cmds or not readonly.match(cmds[-1].command):
        return "verification"
    return "planning"


def recovery_at_k(policy, failures: Sequence[EpisodeRecord], tasks_by_id: dict, k: int,
                  layout: ChatLayout, config: RolloutConfig, *, seed: int = 0,
                  r: str = CONDENSED_PROMPT, history_turns: int = 0) -> dict:
    """Recovery@k: the share of failure states from which at least one of ``k`` recovery attempts
    (from the restored s_f, h_f -- its last ``history_turns`` turns, 0: all -- and r in context)
    passes; by error category of the failure; mean turns and generated tokens per recovery
    episode; the attempts' ``records``.  The failures' snapshots are kept."""
    specs = []
    for f in failures:
        specs += recovery_specs(tasks_by_id[f.task_id], f, k, seed=seed, recovery_prompt=r,
                                history_turns=history_turns)
    out = run_rollouts(specs, policy, layout, dataclasses.replace(config,
                                                                  snapshot_before_verify=False))
    by_parent: dict[str, list[EpisodeRecord]] = {}
    for rec in out.records:
        by_parent.setdefault(rec.parent_episode_id, []).append(rec)
    recovered, cats = {}, {}
    for f in failures:
        ok = any(x.status.counts and x.passed for x in by_parent.get(f.episode_id, []))
        recovered[f.episode_id] = ok
        c = cats.setdefault(error_category(f), [0, 0])
        c[0] += int(ok)
        c[1] += 1
    counted = [x for x in out.records if x.status.counts]
    n = max(len(counted), 1)
    return {"recovery_at_k": sum(recovered.values()) / max(len(failures), 1), "k": k,
            "states": len(failures),
            "by_category": {c: {"states": v[1], "recovered": v[0], "rate": v[0] / v[1]}
                            for c, v in sorted(cats.items())},
            "mean_turns": sum(x.num_turns for x in counted) / n,
            "mean_tokens": sum(t.output_tokens for x in counted for t in x.turns) / n,
            "episodes": len(counted), "records": out.records}


def episode_costs(records: Sequence[EpisodeRecord]) -> dict:
    """Mean turns and generated tokens per counted episode (the efficiency cost per arm)."""
    counted = [x for x in records if x.status.counts]
    n = max(len(counted), 1)
    return {"mean_turns": sum(x.num_turns for x in counted) / n,
            "mean_tokens": sum(t.output_tokens for x in counted for t in x.turns) / n}
