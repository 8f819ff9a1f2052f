"""Policies: what writes the agent's turns.

A :class:`Policy` answers a batch of :class:`~tr.agent.harness.GenerationRequest` with one
:class:`~tr.agent.transcript.Generation` each.  Three kinds:

* :class:`ScriptedPolicy` — replays a task's reference solution block by block (one block = one
  turn; an external layout's whole script is one turn), optionally with seeded injected mistakes.
  The embedded default teacher, and a fast way to drive the engine.  Stateless: the next block is
  read off the conversation, so it also works behind an HTTP server.
* :class:`ModelPolicy` — the JAX sampler (token-in/token-out); :func:`load_model_policy`.
* :class:`~tr.agent.http_policy.HttpPolicy` — any OpenAI-compatible chat endpoint.

:class:`RequestBatcher` turns blocking per-episode calls from many threads into batched policy calls.
"""

from __future__ import annotations

import random
import re
import shlex
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from tr.agent.harness import (
    FORMAT_REMINDER, SUMMARY_INTRO, SUMMARY_REQUEST, Cancelled, GenerationRequest, format_action,
)
from tr.agent.harness import Budgets
from tr.agent.transcript import ChatLayout
from tr.agent.transcript import Generation
from tr.envs.tasks import split_turns
from tr.envs.tasks.model import script_interpreter
from tr.models.config import get_model_config
from tr.models.decoder import Decoder
from tr.models.tokenizer import ByteTokenizer
from tr.sampling.sampler import EVAL_SAMPLING, JaxSampler, SamplingParams, TRAINING_SAMPLING
from tr.sampling.slots import EpisodeSampler


class Policy(Protocol):
    """``generate`` answers a batch.  Optional: ``check_request(req)`` raises ValueError for a
    request the policy cannot answer (an unknown task), so a server refuses it before batching."""

    name: str

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...


# ----------------------------------------------------------------------------------------------
# Scripted teacher.

_PROGRESS = re.compile(r"\[scripted-progress: (\d+)\]")
# User messages that answer a turn; any other user message (task, recovery prompt) is an anchor.
_NOT_ANCHORS = ("exit_code:", FORMAT_REMINDER[:30], SUMMARY_REQUEST[:30])


def solution_commands(task) -> list[str]:
    """The reference solution as agent turns: the blocks of a tr ``solve.sh``; for an external
    layout (Harbor, TB1) one turn that writes the script to a file and runs it with its own
    interpreter (so its ``set -e`` or ``exit`` stay out of the agent's persistent shell)."""

    if task.solution is None:
        raise ValueError(f"task {task.id}: has no reference solution")
    text = task.solution.read_text(encoding="utf-8")
    if task.layout == "tr":
        return split_turns(text)
    marker = "TR_SOLUTION_EOF"
    if marker in text:
        raise ValueError(f"{task.solution}: contains {marker!r}, cannot be replayed as one command")
    interpreter = " ".join(shlex.quote(w) for w in script_interpreter(text))
    return [f"cat > /tmp/tr-solve <<'{marker}'\n{text.rstrip()}\n{marker}\n{interpreter} /tmp/tr-solve"]


def inject_mistake(command: str, rng: random.Random) -> str:
    """A wrong version of a command: a typo in its first word, a missing file, or a no-op."""
    kind = rng.randrange(3)
    first, _, rest = command.partition(" ")
    if kind == 0 and len(first) >= 2:
        i = rng.randrange(len(first) - 1)
        first = first[:i] + first[i + 1] + first[i] + first[i + 2:]
        if first != command.partition(" ")[0]:
            return f"{first} {rest}".rstrip() if rest else first
    if kind == 1:
        return "cat ./no-such-file-$RANDOM.txt"
    return "true  # skipped a step"


class ScriptedPolicy:
    """Replays reference solutions.  The block to play is ``k`` = assistant messages since the last
    anchor (the task message, a recovery prompt, or a summary, which carries ``k`` forward).
    With ``mistake_prob`` p, each block is independently replaced by a wrong command
    (:func:`inject_mistake`), seeded by ``(seed, task, episode seed, block)``."""

    def __init__(self, tasks: Sequence, *, mistake_prob: float = 0.0, seed: int = 0,
                 name: str = "scripted", source: str = "teacher"):
        if not 0.0 <= mistake_prob <= 1.0:
            raise ValueError(f"mistake_prob={mistake_prob} must be in [0, 1]")
        self.name = name
        self.source = source
        self.mistake_prob = mistake_prob
        self.seed = seed
        self.commands = {t.id: solution_commands(t) for t in tasks if t.solution is not None}
        self.by_instruction = {t.instruction.strip(): t.id for t in tasks}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self._one(r) for r in requests]

    def _task_id(self, req: GenerationRequest) -> str:
        if req.task_id in self.commands:
            return req.task_id
        for m in req.messages:
            if m["role"] == "user":
                text = m["content"].split(f"\n\n{SUMMARY_INTRO}")[0].strip()
                if text in self.by_instruction and self.by_instruction[text] in self.commands:
                    return self.by_instruction[text]
                break
        if not req.task_id:
            raise ValueError("scripted policy: no task_id, and the first user message is no known "
                             "task's instruction")
        raise ValueError(f"scripted policy: no reference solution for task {req.task_id!r}")

    def check_request(self, req: GenerationRequest) -> None:
        """Raises ValueError when ``req`` names no task this policy can replay (the server's 400)."""
        self._task_id(req)

    def _one(self, req: GenerationRequest) -> Generation:
        commands = self.commands[self._task_id(req)]
        k = _progress(req.messages)
        if req.purpose == "summary":
            text = (f"I ran the first {k} step(s) of my plan; the remaining steps follow. "
                    f"[scripted-progress: {k}]")
            return Generation(text=text, source=self.source)
        if k >= len(commands):
            return Generation(text=format_action("All steps are done.", None), source=self.source)
        command = commands[k]
        rng = random.Random(f"{self.seed}:{req.task_id}:{req.seed}:{k}")
        if self.mistake_prob > 0 and rng.random() < self.mistake_prob:
            command = inject_mistake(command, rng)
        return Generation(text=format_action(f"Step {k + 1} of {len(commands)}.", command),
                          source=self.source)


def _progress(messages: Sequence[dict]) -> int:
    """Blocks already played: assistant replies after the last anchor, plus a summary's count."""
    anchor, base = 1, 0
    for i, m in enumerate(messages):
        if m["role"] != "user":
            continue
        if i == 1 or not m["content"].startswith(_NOT_ANCHORS):
            anchor, base = i, 0
        found = _PROGRESS.search(m["content"]) if SUMMARY_INTRO in m["content"] else None
        if found:
            anchor, base = i, int(found.group(1))
    return base + sum(1 for m in messages[anchor + 1:] if m["role"] == "assistant")


# ----------------------------------------------------------------------------------------------
# Batching many episodes' calls into one policy call.

class RequestBatcher:
    """Collects blocking :meth:`generate` calls from episode threads into batched policy calls.

    A batch is sent when every registered episode is waiting, when ``max_batch`` requests wait, or
    ``window_s`` after the first request of the batch arrived — so generation for all active
    episodes is batched while their sandboxes work concurrently.  An asynchronous policy (one with
    ``submit``, e.g. the model over :class:`~tr.sampling.slots.EpisodeSampler`) batches itself
    (continuous batching): each call goes straight to it, one request per call.  :meth:`cancel` fails every
    waiting and future call with :class:`Cancelled`.
    """

    def __init__(self, policy: Policy, *, max_batch: int = 64, window_s: float = 0.02):
        self.policy = policy
        self.max_batch = max_batch
        self.window_s = window_s
        self._cv = threading.Condition()
        self._pending: list[tuple[GenerationRequest, dict]] = []
        self._active = 0
        self._cancelled = threading.Event()
        self._closed = False
        self.calls = 0
        self.batch_sizes: list[int] = []
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="request-batcher", daemon=True)
        self._thread.start()

    # episode side ------------------------------------------------------------------------------
    def register(self) -> None:
        with self._cv:
            self._active += 1

    def unregister(self) -> None:
        with self._cv:
            self._active -= 1
            self._cv.notify_all()

    def generate(self, req: GenerationRequest) -> Generation:
        if getattr(self.policy, "asynchronous", False):
            return self._generate_async(req)
        slot: dict = {}
        with self._cv:
            if self._cancelled.is_set():
                raise Cancelled()
            self._pending.append((req, slot))
            self._cv.notify_all()
            while "out" not in slot and "err" not in slot:
                self._cv.wait()
        if "err" in slot:
            raise slot["err"]
        return slot["out"]

    def _generate_async(self, req: GenerationRequest) -> Generation:
        """An asynchronous policy (``submit``, continuous batching): the request goes to it at once;
        :meth:`cancel` still fails the wait with :class:`Cancelled`."""
        with self._cv:
            if self._cancelled.is_set():
                raise Cancelled()
        t0 = time.monotonic()
        fut = self.policy.submit(req)

        def wake(_):
            with self._cv:
                self._cv.notify_all()
        fut.add_done_callback(wake)
        with self._cv:
            while not fut.done() and not self._cancelled.is_set():
                self._cv.wait()
            if not fut.done():
                raise Cancelled()
            self.calls += 1
            self.batch_sizes.append(1)
            self.busy_s += time.monotonic() - t0
        return fut.result()

    # engine side -------------------------------------------------------------------------------
    def cancel(self) -> None:
        with self._cv:
            self._cancelled.set()
            for _, slot in self._pending:
                slot["err"] = Cancelled()
            self._pending.clear()
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed and not self._pending:
                    return
                deadline = time.monotonic() + self.window_s
                while (self._pending and len(self._pending) < min(self.max_batch, max(self._active, 1))
                       and not self._closed):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                batch = self._pending[:self.max_batch]
                del self._pending[:len(batch)]
            if not batch:
                continue
            t0 = time.monotonic()
            try:
                outs = self.policy.generate([r for r, _ in batch])
                if len(outs) != len(batch):
                    raise RuntimeError(f"policy {self.policy.name} returned {len(outs)} generations "
                                       f"for {len(batch)} requests")
                results = [("out", o) for o in outs]
            except Exception as e:  # noqa: BLE001 — delivered to every caller of the batch
                results = [("err", e)] * len(batch)
            dt = time.monotonic() - t0
            with self._cv:
                self.calls += 1
                self.batch_sizes.append(len(batch))
                self.busy_s += dt
                for (_, slot), (key, val) in zip(batch, results):
                    slot[key] = val
                self._cv.notify_all()


# ----------------------------------------------------------------------------------------------
# The JAX model.

class ModelPolicy:
    """The JAX sampler behind the harness, token-in/token-out: each request's ``prompt_tokens`` (the
    episode's exact context) go to the sampler as they are, and the sampled ids — stop token
    included — come back with their behaviour log-probabilities: log-probs under the distribution
    they were sampled from (``temperature``, ``top_p``; SPEC §2).  Training rollouts use
    ``TRAINING_SAMPLING`` (1.0, 1.0), evaluation ``EVAL_SAMPLING`` (0.6, 0.95, the default).  One
    batched sampler call per batch of requests; each request keeps its own ``max_tokens``."""

    def __init__(self, sampler, tokenizer, *, temperature: float = 0.6, top_p: float = 0.95,
                 seed: int = 0, name: str = "model", max_seq_len: int | None = None):

        self.sampler, self.tokenizer = sampler, tokenizer
        self.layout = ChatLayout(tokenizer)
        self.temperature, self.top_p, self.seed, self.name = temperature, top_p, seed, name
        self.max_seq_len = max_seq_len if max_seq_len is not None else sampler.config.max_seq_len
        self._calls = 0
        self._lock = threading.Lock()

    def budgets(self, max_output_tokens: int = 256, *, context: int = 0, **kw):
        """Harness budgets that fit the sampler's shape buckets: the prompt bucket (a power of two)
        plus the new-token bucket must stay within ``max_seq_len``.  Summarise early enough that one
        more turn, the summary request and the summary itself still fit the prompt bucket.

        ``context`` > 0: the episode's whole context (prompt + output) instead of that bucket
        rule, up to ``max_seq_len`` over an episode sampler (its caches hold the model's whole
        context, no prompt bucket), up to the bucket rule's over a batch sampler."""

        new_bucket = 1 << max(max_output_tokens - 1, 1).bit_length()
        prompt = 1 << (self.max_seq_len - new_bucket).bit_length() - 1
        if prompt < 64:
            raise ValueError(f"max_output_tokens={max_output_tokens} leaves no room for a prompt in "
                             f"max_seq_len={self.max_seq_len}")
        if context:
            limit = self.max_seq_len if self.asynchronous else prompt + max_output_tokens
            if not max_output_tokens + 64 <= context <= limit:
                raise ValueError(f"context={context}: must leave a prompt of >= 64 tokens beside "
                                 f"max_output_tokens={max_output_tokens} and be <= {limit} (the "
                                 f"{'model max_seq_len' if self.asynchronous else 'prompt bucket + output'})")
            prompt = context - max_output_tokens
        kw.setdefault("summarise_at_tokens", max(prompt // 2, prompt - 2 * max_output_tokens - 256))
        return Budgets(max_output_tokens=max_output_tokens,
                       max_context_tokens=prompt + max_output_tokens, **kw)

    @property
    def asynchronous(self) -> bool:
        """True over an episode-aware sampler (``submit``): requests join its decode slots one by
        one (continuous batching) instead of waiting for a batch; see :meth:`submit`."""
        return hasattr(self.sampler, "submit")

    def _params(self, caps: Sequence[int], seed: int):
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_new_tokens=max(caps),
                              stop_token_ids=(self.tokenizer.eos_id,), seed=seed)

    def _generation(self, c) -> Generation:
        ids = [int(i) for i in c.token_ids]
        body = ids[:-1] if ids and ids[-1] == self.tokenizer.eos_id else ids
        return Generation(text=self.tokenizer.decode(body), tokens=ids, logprobs=[float(x) for x in c.logprobs],
                          finish_reason="length" if c.finish_reason == "length" else "stop", source="policy")

    def submit(self, req: GenerationRequest):
        """One request to an episode-aware sampler: a future of its :class:`Generation`.  The
        episode's KV cache is reused across its turns; its random key depends only on (policy seed,
        episode, episode seed, turn, purpose), not on which requests share the decode slots."""
        import zlib
        from concurrent.futures import Future

        salt = zlib.crc32(f"{req.episode_id}:{req.seed}:{req.turn}:{req.purpose}".encode())
        inner = self.sampler.submit(list(req.prompt_tokens), self._params([req.max_tokens], self.seed),
                                    max_new_tokens=req.max_tokens, episode_id=req.episode_id or None, salt=salt)
        out: Future = Future()

        def done(f):
            if f.exception() is not None:
                out.set_exception(f.exception())
            else:
                out.set_result(self._generation(f.result()))
        inner.add_done_callback(done)
        return out

    def end_episode(self, episode_id: str) -> None:
        """The episode ended or was cancelled: the sampler frees its KV cache."""
        if hasattr(self.sampler, "end_episode"):
            self.sampler.end_episode(episode_id)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        if self.asynchronous:
            return [f.result() for f in [self.submit(r) for r in requests]]
        with self._lock:
            call = self._calls
            self._calls += 1
        caps = [r.max_tokens for r in requests]
        params = self._params(caps, self.seed * 1_000_003 + call)
        outs = self.sampler.generate([list(r.prompt_tokens) for r in requests], params, max_new_tokens=caps)
        return [self._generation(c) for c in outs]


def load_model_policy(name: str = "tiny", *, model=None, seed: int = 0, temperature: float | None = None,
                      top_p: float | None = None, sampling: str = "eval", engine: str = "episode",
                      slots: int = 16) -> ModelPolicy:
    """A :class:`ModelPolicy` over ``model`` (a ``tr.models.decoder.Decoder``), or over a freshly
    initialised model of the named size (``seed``) — the untrained tiny model by default.
    ``sampling``: ``"eval"`` (temperature 0.6, top-p 0.95) or ``"train"`` (1.0, 1.0: behaviour
    log-probs are the raw model's, so the first PPO ratio is 1); ``temperature`` / ``top_p`` override.
    ``engine``: ``"episode"`` (:class:`~tr.sampling.slots.EpisodeSampler`: KV caches kept across an
    episode's turns, ``slots`` decode slots, continuous batching) or ``"reprefill"``
    (:class:`~tr.sampling.sampler.JaxSampler`: each batch re-reads every prompt)."""
    from flax import nnx

    presets = {"eval": EVAL_SAMPLING, "train": TRAINING_SAMPLING}
    if engine not in ("episode", "reprefill"):
        raise ValueError(f"load_model_policy: engine={engine!r}; expected 'episode' or 'reprefill'")
    if sampling not in presets:
        raise ValueError(f"load_model_policy: sampling={sampling!r}; expected one of {sorted(presets)}")
    temperature = presets[sampling][0] if temperature is None else temperature
    top_p = presets[sampling][1] if top_p is None else top_p

    if model is None:
        model = Decoder(get_model_config(name), rngs=nnx.Rngs(seed))
    tokenizer = ByteTokenizer(vocab_size=model.config.vocab_size)
    sampler = (EpisodeSampler(model, tokenizer, slots=slots, max_new_tokens=512) if engine == "episode"
               else JaxSampler(model, tokenizer))
    return ModelPolicy(sampler, tokenizer, temperature=temperature, top_p=top_p,
                       seed=seed, name=f"model:{model.config.name}")
