"""Episode records and their conversion to the training arrays of SPEC §2.

An :class:`EpisodeRecord` holds everything one attempt produced: every turn (thought, command,
observation, exit code, timings), the verifier result, the status, and the token sequence as
**segments** (prompt, action, observation, summary ...) carrying the exact token ids the sampler
produced and its behaviour log-probabilities.  :func:`episode_to_sequences` turns a record into one
dict of 1-D arrays per context window (a window ends at an active-summarisation boundary); the ids
are copied from the segments, never re-tokenised from text (token-in/token-out).

Records are plain JSON (:meth:`EpisodeRecord.to_json` / :meth:`EpisodeRecord.from_json`); shards are
JSONL files, one record per line (:func:`write_shard`, read back by ``tr.data``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import chex
import numpy as np


class EpisodeStatus(str, enum.Enum):
    """How an episode ended.

    ``VERIFIED_PASS`` / ``VERIFIED_FAIL``: the agent declared it was done and the verifier judged.
    ``TURN_CAP`` / ``CONTEXT_OVERFLOW`` / ``AGENT_TIMEOUT``: a budget ran out; the verifier still
    judged the final state (``EpisodeRecord.passed`` holds its verdict).
    ``INFRA_FAILURE``: the sandbox or the harness broke — shown not to be the agent's doing, kept
    out of training statistics.  A verifier error (timeout, crash, no result) is infra only when
    the harness can show it is its own (``EpisodeRecord.verifier_fault == "harness"``: the sandbox
    died, or a canary verification of the untouched environment failed too); otherwise
    (``verifier_fault == "agent"``) the episode keeps its verdict status with ``passed=False``.
    ``CANCELLED``: stopped by the engine (over-sampling), never used.
    """

    VERIFIED_PASS = "verified_pass"
    VERIFIED_FAIL = "verified_fail"
    TURN_CAP = "turn_cap"
    CONTEXT_OVERFLOW = "context_overflow"
    AGENT_TIMEOUT = "agent_timeout"
    INFRA_FAILURE = "infra_failure"
    CANCELLED = "cancelled"

    @property
    def counts(self) -> bool:
        """True when the episode belongs in training data and statistics."""
        return self not in (EpisodeStatus.INFRA_FAILURE, EpisodeStatus.CANCELLED)


# Segment kinds: what wrote the tokens.  Only "action" and "summary" segments are generated.
SEGMENT_KINDS = ("prompt", "action", "observation", "summary_request", "summary")
# Segment sources: who generated an action segment.  "inherited" marks the earlier history h_f a
# recovery episode starts from: context, not actions of this episode.
SEGMENT_SOURCES = ("policy", "teacher", "inherited", "env")
GENERATED_KINDS = ("action", "summary")


@dataclasses.dataclass
class Segment:
    """A run of tokens of one kind within one turn and one context window."""

    kind: str
    tokens: list[int]
    turn: int
    window: int = 0
    source: str = "env"
    logprobs: list[float] | None = None

    def __post_init__(self):
        if self.kind not in SEGMENT_KINDS:
            raise ValueError(f"Segment.kind={self.kind!r}: expected one of {SEGMENT_KINDS}")
        if self.source not in SEGMENT_SOURCES:
            raise ValueError(f"Segment.source={self.source!r}: expected one of {SEGMENT_SOURCES}")
        if self.logprobs is not None and len(self.logprobs) != len(self.tokens):
            raise ValueError(
                f"Segment(kind={self.kind}, turn={self.turn}): {len(self.logprobs)} logprobs "
                f"for {len(self.tokens)} tokens")


@dataclasses.dataclass
class TurnRecord:
    """One agent turn: the raw reply, what was parsed out of it, and what the shell answered."""

    turn: int
    kind: str  # "command" | "done" | "format_error" | "summary"
    text: str
    thought: str = ""
    command: str | None = None
    observation: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    format_error: str | None = None
    finish_reason: str = "stop"
    output_tokens: int = 0
    gen_s: float = 0.0
    env_s: float = 0.0
    window: int = 0


@dataclasses.dataclass
class EpisodeRecord:
    """Everything one attempt produced."""

    episode_id: str
    task_id: str
    family: str = ""
    tier: str = ""
    group_id: str = ""
    rollout_index: int = 0
    kind: str = "original"  # "original" | "recovery"
    policy: str = ""
    seed: int = 0
    status: EpisodeStatus = EpisodeStatus.INFRA_FAILURE
    passed: bool | None = None
    matched: float | None = None
    executed: int | None = None
    verifier: dict | None = None  # VerifierResult.to_dict()
    error: str | None = None
    # None: the verifier ran cleanly; "agent": it failed but the untouched environment verifies
    # cleanly (a failed attempt); "harness": shown to be the harness's (INFRA_FAILURE).
    verifier_fault: str | None = None
    snapshot_ref: dict | None = None
    parent_episode_id: str | None = None
    recovery_prompt: str | None = None
    history_turns: int = 0  # a recovery: the turns of h_f it inherited (0 = all; see
    #                         tr.agent.transcript.inherited_history)
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    segments: list[Segment] = dataclasses.field(default_factory=list)
    messages: list[dict] = dataclasses.field(default_factory=list)  # chat view of the last window
    format_errors: int = 0
    summaries: int = 0
    context_tokens: int = 0
    wall_s: float = 0.0
    env_s: float = 0.0
    gen_s: float = 0.0
    setup_s: float = 0.0
    verify_s: float = 0.0
    finished_at: float = 0.0

    @property
    def num_turns(self) -> int:
        """Agent turns taken (summaries excluded)."""
        return sum(1 for t in self.turns if t.kind != "summary")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str = "record") -> "EpisodeRecord":
        """Rebuild a record; bad input raises ValueError naming ``where`` and the field."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        for required in ("episode_id", "task_id"):
            if required not in data:
                raise ValueError(f"{where}: missing field {required!r}")
        fields = dict(data)
        try:
            fields["status"] = EpisodeStatus(fields.get("status", "infra_failure"))
        except ValueError:
            raise ValueError(f"{where}: field 'status' has unknown value {data.get('status')!r}; "
                             f"expected one of {[s.value for s in EpisodeStatus]}") from None
        try:
            fields["turns"] = [TurnRecord(**t) for t in fields.get("turns", [])]
            fields["segments"] = [Segment(**s) for s in fields.get("segments", [])]
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: bad turn or segment: {e}") from None
        return cls(**fields)


# ----------------------------------------------------------------------------------------------
# Conversion to training arrays.

TRAINING_FIELDS = ("tokens", "actor_mask", "loss_mask", "turn_ids", "rewards", "dones", "logprobs")
TRAINING_DTYPES = {
    "tokens": np.int32, "actor_mask": np.bool_, "loss_mask": np.bool_, "turn_ids": np.int32,
    "rewards": np.float32, "dones": np.bool_, "logprobs": np.float32,
}


def window_count(record: EpisodeRecord) -> int:
    return 1 + max((s.window for s in record.segments), default=0)


def episode_to_sequences(
    record: EpisodeRecord,
    reward: float,
    *,
    loss_sources: Sequence[str] = ("policy", "teacher"),
) -> list[dict[str, np.ndarray]]:
    """One dict of SPEC §2 arrays (1-D, length = window tokens) per context window.

    ``actor_mask[i]`` is true on tokens generated in this episode (action and summary segments whose
    source is ``policy`` or ``teacher``); inherited history (a recovery episode's ``h_f``) is context.
    ``loss_mask = actor_mask ∧ source ∈ loss_sources`` (e.g. ``("teacher",)`` for ReTerm SFT).
    ``rewards``: ``reward`` on the last actor token of each window, 0 elsewhere; ``dones`` true there.
    A window that ends at an active-summarisation boundary is credited with the episode reward too:
    the paper gives no value transport across a summary, so each window is scored Monte-Carlo style
    by the episode outcome.  ``logprobs``: behaviour log-probabilities on actor tokens (0 where the
    generator gave none, e.g. a scripted or HTTP teacher), 0 elsewhere.  Windows with no actor
    token are dropped; a window ends at its last actor token (a trailing observation is dropped).
    """
    bad = set(loss_sources) - set(SEGMENT_SOURCES)
    if bad:
        raise ValueError(f"loss_sources: unknown source(s) {sorted(bad)}; expected {SEGMENT_SOURCES}")
    out = []
    for w in range(window_count(record)):
        segs = [s for s in record.segments if s.window == w]
        tokens, actor, loss, turn_ids, logprobs = [], [], [], [], []
        for s in segs:
            n = len(s.tokens)
            is_actor = s.kind in GENERATED_KINDS and s.source in ("policy", "teacher")
            tokens.extend(s.tokens)
            actor.extend([is_actor] * n)
            loss.extend([is_actor and s.source in loss_sources] * n)
            turn_ids.extend([s.turn] * n)
            if is_actor and s.logprobs is not None:
                logprobs.extend(s.logprobs)
            else:
                logprobs.extend([0.0] * n)
        actor_arr = np.asarray(actor, dtype=np.bool_)
        if not actor_arr.any():
            continue
        last = int(np.flatnonzero(actor_arr)[-1])
        # What follows the window's last actor token (the observation of a turn-capped episode's
        # last command) is no node and no loss, and a causal model's values and log-probs before
        # it do not see it: dropped, so the window is at most the context the policy generated in.
        end = last + 1
        tokens, turn_ids, logprobs = tokens[:end], turn_ids[:end], logprobs[:end]
        actor_arr, loss = actor_arr[:end], loss[:end]
        rewards = np.zeros(len(tokens), np.float32)
        dones = np.zeros(len(tokens), np.bool_)
        rewards[last] = np.float32(reward)
        dones[last] = True
        seq = {
            "tokens": np.asarray(tokens, np.int32),
            "actor_mask": actor_arr,
            "loss_mask": np.asarray(loss, np.bool_),
            "turn_ids": np.asarray(turn_ids, np.int32),
            "rewards": rewards,
            "dones": dones,
            "logprobs": np.asarray(logprobs, np.float32),
        }
        check_sequence(seq)
        out.append(seq)
    return out


def check_sequence(seq: dict[str, np.ndarray]) -> None:
    """Asserts one sequence has every training field, 1-D, equal length, the SPEC dtypes."""
    missing = [k for k in TRAINING_FIELDS if k not in seq]
    if missing:
        raise ValueError(f"sequence is missing field(s) {missing}")
    chex.assert_rank([seq[k] for k in TRAINING_FIELDS], 1)
    chex.assert_equal_shape([seq[k] for k in TRAINING_FIELDS])
    for k in TRAINING_FIELDS:
        chex.assert_type(seq[k], TRAINING_DTYPES[k])


def pad_sequences(
    seqs: Sequence[dict[str, np.ndarray]], length: int, *, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Stacks sequences into ``[B, length]`` arrays, right-padded (pad positions: token ``pad_id``,
    all masks false, reward 0).  A sequence longer than ``length`` raises (never silently cut)."""
    b = len(seqs)
    batch = {k: np.zeros((b, length), TRAINING_DTYPES[k]) for k in TRAINING_FIELDS}
    batch["tokens"][:] = pad_id
    for i, s in enumerate(seqs):
        n = len(s["tokens"])
        if n > length:
            raise ValueError(f"sequence {i} has {n} tokens > row length {length}")
        for k in TRAINING_FIELDS:
            batch[k][i, :n] = s[k]
    return batch


# ----------------------------------------------------------------------------------------------
# Shards.

def write_shard(records: Iterable[EpisodeRecord], path: str | os.PathLike) -> int:
    """Writes records as JSONL (one record per line) atomically; returns the count."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_json(), separators=(",", ":")))
            f.write("\n")
            n += 1
    os.replace(tmp, path)
    return n


def read_shard(path: str | os.PathLike) -> list[EpisodeRecord]:
    """Reads every record of a JSONL shard; a bad line raises naming the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            out.append(parse_record_line(line, where=f"{os.fspath(path)}:{lineno}"))
    return out


def parse_record_line(line: str | bytes, *, where: str) -> EpisodeRecord:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    return EpisodeRecord.from_json(data, where=where)
