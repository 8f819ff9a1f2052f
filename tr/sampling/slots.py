"""Continuous-batching sampler whose per-episode KV caches live across turns (`EpisodeSampler`).

**Rows.** The sampler owns `slots` cache rows (the memory budget: `slots x cache_len` token slots,
`bytes_per_row` each). A live episode keeps its row between turns; its next request prefills only
the tokens appended since (the observation and the assistant header), then decodes. A request
whose prompt does not extend the cached tokens (a summary replaced the history) keeps the longest
common prefix and prefills the rest, so the cache is rebuilt from the new context. Rows are freed by
`end_episode` (episode ended or cancelled); when a request finds no free row, the least recently
used idle row is evicted and its episode rebuilds its cache by prefill on its next turn.

**Continuous batching.** One engine thread runs the rows as a fixed set of decode slots: it decodes
`decode_steps` tokens for every active row per call (one compiled `while_loop`), then, between
calls, retires the rows that reached a stop token or their cap (their futures resolve at once) and
admits queued requests into free rows (prefill), so short requests never wait for long ones; while
a request is queued, a decode call returns as soon as any row finishes, so a freed row never idles;
while a free row's episode is live (its next request is coming from its sandbox) a call decodes at
most `refill_decode_steps` (traced: no recompile), so that request waits at most that many tokens.
**Active rows only:** a call computes the rows that have a request, rounded up to a multiple of
`ceil(slots / decode_buckets)` rows (padded with idle rows), not every slot: idle slots (episodes
in their sandboxes) cost nothing. The call gathers those rows' decode state, reads their cache rows
in place (`Decoder.extend(rows=...)`), writes their new K/V into their own rows and scatters the
state back. `decode_buckets=1` (and `batch_invariant`) decodes every row every call.

**Cache layout.** Head-major: `keys, values [n_layers, slots, n_kv_heads, S, head_dim]` and
`end [slots]` (rows are at different lengths); row `b` holds its tokens in slots `0 .. end[b]-1` (no
padding holes: a token's rotary position is its slot), `valid = slot < end`. Every call runs the
decoder on its rows as one batch through `Decoder.extend`, which, layer by layer, writes the new
tokens' K/V at each row's `end` (one in-place `dynamic_update_slice` per row, where a scatter cost a
pass over the whole cache per step; no `vmap`) and then reads the layer (each row's head a
contiguous `[S, head_dim]` matrix; slots `< span`, the longest participating row, in
`attention_block`-slot blocks with an online softmax, so a step costs what the rows' lengths need,
not `S`; the slots just written are masked). Write-before-read orders every write after the reads
it must follow by data, so the cache is one buffer updated in place: no whole-cache copy in any
compiled call (`cache_copies()`; with the writes after all layers XLA copied the cache twice per
call, most of a decode step). `capacity` (slots per row) grows by doubling up to `cache_len` when a
request needs more.

**Prefill.** The requests admitted together are prefilled in calls of a power-of-two number of rows
(the binary digits of their count: 5 rows are a 4-row and a 1-row call, never 8 with 3 of padding),
each row's appended tokens in chunks of `prefill_chunk` (right-padded); the same call starts the
rows' requests (their sampling fields go into the decode state inside it, no host-side updates).

**Compiles.** Prefill is compiled per (rows-in-call power of two <= `slots`, capacity), decode per
(row bucket, capacity), at most `decode_buckets` buckets: all bounded, so the count is bounded (`compile_counts`); `span` is traced, so row
lengths never recompile; the weights are an argument, so `update_weights` never recompiles (it
drops every cached episode). `precompile(capacity)` compiles them all up front.

**Sharding.** Under `mesh` the cache is split by `HEAD_MAJOR_CACHE_AXES` (rows by `cache_batch`, kv
heads by `cache_kv_heads`, tr/models/sharding.py) and the per-row decode state by rows; every
compiled piece constrains its outputs so, and the arrays are created split.

**Sampling** (`tr.sampling.sampler.sample_token`): each request has its own key `fold_in(key(seed),
salt)` and token `t` uses `fold_in(that, t)`, so samples do not depend on which rows share a call.
`Completion.logprobs` are under the distribution sampled from, `raw_logprobs` the model's.  With
`batch_invariant=True` prefill takes one row per call, so a request's tokens and log-probs are
bit-identical whatever else is in flight alone or beside other episodes, in any row, after other samplers compiled in the process, after
`update_weights` (tests/test_slots.py), and in a fresh process (decode runs every row: its shapes
never follow the load). The row count `slots` is part of the compiled decode, though: XLA CPU accumulates some row reductions in another order for larger
batches (e.g. a mean over 128 features: bit-equal for 1..16 rows, not for 32), so the same request
on 32 or 64 rows gets log-probs up to ~2e-6 away from 16 rows (the gym model; 17 rows were
identical), which can flip a sample that sits on a category boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import zlib
from collections import Counter, deque
from concurrent.futures import Future
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tr.models.decoder import HEAD_MAJOR_CACHE_AXES, Decoder, KVCache
from tr.models.sharding import constrain
from tr.models.tokenizer import Tokenizer
from tr.sampling.sampler import Completion, SamplingParams, pow2_bucket, replace_weights, sample_token

MAX_STOP_IDS = 4


def _row_axes(x: jax.Array) -> tuple[str | None, ...]:
    """Per-row state `[slots, ...]`: rows split like the cache's rows (`cache_batch`), the rest whole."""
    return ("cache_batch",) + (None,) * (x.ndim - 1)


def _constrain_state(keys, values, end, dec=None):
    """The engine's arrays on the active mesh (a no-op without one): the head-major cache by
    `HEAD_MAJOR_CACHE_AXES`, per-row state by rows."""
    keys, values = constrain(keys, HEAD_MAJOR_CACHE_AXES), constrain(values, HEAD_MAJOR_CACHE_AXES)
    end = constrain(end, _row_axes(end))
    if dec is None:
        return keys, values, end
    return keys, values, end, {k: constrain(v, _row_axes(v)) for k, v in dec.items()}


class RequestCancelled(Exception):
    """The request's episode ended (or the sampler closed) before it finished."""


@dataclasses.dataclass
class _Request:
    prompt: list[int]
    max_new: int
    temperature: float
    top_p: float
    stop_ids: tuple[int, ...]
    seed: int
    salt: int
    episode_id: str | None
    future: Future
    row: int = -1
    start: int = 0          # tokens reused from the row's cache


@dataclasses.dataclass
class _Row:
    episode_id: str | None = None
    ids: list[int] = dataclasses.field(default_factory=list)   # tokens whose K/V are in the cache
    request: _Request | None = None
    last_used: float = 0.0


@dataclasses.dataclass
class EngineStats:
    """Seconds the engine thread spent prefilling, decoding, and waiting with no active row."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0
    prefill_tokens: int = 0       # real tokens prefilled
    reused_tokens: int = 0        # tokens whose cached K/V a request reused
    generated_tokens: int = 0
    decode_calls: int = 0
    decode_steps: int = 0         # decode steps run (each advances every active row by one token)
    decode_row_steps: int = 0     # rows computed x steps (active or padding): the compute spent
    decode_slot_steps: int = 0    # slots x steps: the slot-occupancy denominator
    evictions: int = 0
    requests: int = 0


def _rows_forward(model: Decoder, keys, values, end, tokens, positions, mask, span, block: int, rows=None):
    """The decoder on some rows at once, each row after its own cached slots `0 .. end[b]-1`.

    keys/values `[n_layers, R, K, S, hd]` (head-major), `rows [B]` the distinct cache rows computed
    (None: all R in order), end `[B]` their lengths, tokens/positions/mask `[B, T]`, span: a bound
    on `end` over the rows whose results are used (only slots `< span` are read). The new tokens'
    K/V are written at slots `end[b] .. end[b]+T-1` of row `rows[b]`, in place, layer by layer
    before that layer's read (`Decoder.extend`). A masked-out token's K/V land at or beyond
    `end[b]`, which `valid` hides until a later write replaces them. Returns (keys, values, hidden
    `[B, T, d]`).
    """
    n_slots = keys.shape[3]
    valid = jnp.arange(n_slots)[None] < end[:, None]
    write_at = jnp.minimum(end, n_slots - tokens.shape[1])
    hidden, keys, values = model.extend(tokens, positions, mask, keys, values, valid, write_at, span=span,
                                        block=block, rows=rows)
    return keys, values, hidden


class EpisodeSampler:
    """Continuous batching over `slots` rows with per-episode KV caches (module docstring).

    `submit(prompt, params, episode_id=..., salt=...) -> Future[Completion]` is the asynchronous
    entry; `generate(prompts, params, max_new_tokens)` is the `SamplerEngine` interface (one-off
    requests, no episode). `end_episode(episode_id)` frees an episode's row and cancels its request.
    """

    def __init__(self, model: Decoder, tokenizer: Tokenizer | None = None, *, slots: int = 32,
                 cache_len: int | None = None, max_new_tokens: int = 256, prefill_chunk: int = 128,
                 min_capacity: int = 512, decode_steps: int = 8, refill_decode_steps: int = 4,
                 attention_block: int = 256, decode_buckets: int = 8,
                 reuse_cache: bool = True, mesh: jax.sharding.Mesh | None = None,
                 batch_invariant: bool = False):
        if slots < 1:
            raise ValueError(f"EpisodeSampler: slots={slots} must be >= 1")
        self.config = model.config
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.graphdef, self.state = nnx.split(model)
        self.slots = slots
        self.cache_len = int(cache_len or self.config.max_seq_len)
        if self.cache_len > self.config.max_seq_len:
            raise ValueError(f"EpisodeSampler: cache_len={self.cache_len} exceeds max_seq_len="
                             f"{self.config.max_seq_len} of model {self.config.name!r}")
        self.max_new_tokens = max_new_tokens
        self.prefill_chunk = pow2_bucket(prefill_chunk, 1)
        self.decode_steps = decode_steps
        self.refill_decode_steps = max(1, min(refill_decode_steps, decode_steps))
        self.attention_block = pow2_bucket(attention_block, 1)
        self.reuse_cache = reuse_cache
        # Prefill one row per call: a row's logits never depend on which rows share a call (a
        # batched prefill's shape, hence its float rounding, follows the admission timing).
        self.batch_invariant = batch_invariant
        if decode_buckets < 1:
            raise ValueError(f"EpisodeSampler: decode_buckets={decode_buckets} must be >= 1")
        # Decode computes the active rows rounded up to a multiple of `row_quantum` (every row when
        # it equals `slots`): at most `decode_buckets` compiled decode shapes per capacity.
        self.row_quantum = slots if batch_invariant else -(-slots // min(decode_buckets, slots))
        self.capacity = min(pow2_bucket(min_capacity, 1), pow2_bucket(self.cache_len, 1))
        self.compile_counts: Counter[str] = Counter()
        self.stats = EngineStats()
        self._rows = [_Row() for _ in range(slots)]
        self._row_of: dict[str, int] = {}
        self._queue: deque[_Request] = deque()
        self._cancel_rows: set[int] = set()
        self._cv = threading.Condition()
        self._device_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._reset_device_state()
        self._prefill_fn = jax.jit(self._prefill_impl, donate_argnums=(1, 2, 4))
        # the jitted decode call (public: a benchmark wraps it to time it)
        self.decode_fn = jax.jit(self._decode_impl, donate_argnums=(1, 2, 4))

    # -- sizes -----------------------------------------------------------------------------------
    @property
    def bytes_per_row(self) -> int:
        """K and V bytes of one row at full `cache_len` (the memory budget is `slots` of these)."""
        c = self.config
        return 2 * c.n_layers * self.cache_len * c.n_kv_heads * c.head_dim * jnp.dtype(c.compute_dtype).itemsize

    def _alloc(self, capacity: int) -> int:
        # slack: a padded prefill chunk never runs off the end; a multiple of the attention block
        return capacity + max(self.prefill_chunk, self.attention_block)

    def _mesh_context(self):
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def _reset_device_state(self) -> None:
        """Empty cache and per-row state, made inside one jit so that on a mesh each array is
        created already split by its logical axes (`_constrain_state`), never whole on one device."""
        c, r = self.config, self.slots
        shape = (c.n_layers, r, c.n_kv_heads, self._alloc(self.capacity), c.head_dim)
        n = pow2_bucket(self.max_new_tokens, 1)

        def make():
            dec = {
                "logits": jnp.zeros((r, c.vocab_size), jnp.float32),
                "out_tokens": jnp.zeros((r, n), jnp.int32), "out_logp": jnp.zeros((r, n), jnp.float32),
                "out_raw": jnp.zeros((r, n), jnp.float32), "length": jnp.zeros(r, jnp.int32),
                "active": jnp.zeros(r, bool), "max_new": jnp.ones(r, jnp.int32),
                "temperature": jnp.ones(r, jnp.float32), "top_p": jnp.ones(r, jnp.float32),
                "seed": jnp.zeros(r, jnp.int32), "salt": jnp.zeros(r, jnp.int32),
                "stop_ids": jnp.full((r, MAX_STOP_IDS), -1, jnp.int32),
            }
            return _constrain_state(jnp.zeros(shape, c.compute_dtype), jnp.zeros(shape, c.compute_dtype),
                                    jnp.zeros(r, jnp.int32), dec)

        with self._mesh_context():
            self._keys, self._values, self._end, self._dec = jax.jit(make)()

    # -- compiled pieces ---------------------------------------------------------------------------
    def _prefill_impl(self, state, keys, values, end, dec, rows, tokens, n_real, start, fields):
        """Prefill `tokens [Bj, T]` (right-padded, `n_real` real) into `rows [Bj]` from slot `start`.

        Rows index `>= slots` are padding (gathered clipped, scattered dropped). Sets each row's
        `end = start + n_real`, where `n_real > 0` its next-token logits, and starts its request:
        `fields` (max_new, temperature, top_p, seed, salt, stop_ids `[Bj, ...]`) copied into the
        row's decode state, output length 0, active (no decode runs between a request's chunks).
        """
        self.compile_counts["prefill"] += 1  # runs only while tracing
        model = nnx.merge(self.graphdef, state)
        t = tokens.shape[1]
        positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        mask = jnp.arange(t)[None] < n_real[:, None]
        valid = jnp.arange(keys.shape[3])[None] < start[:, None]
        # Row i's chunk goes to slots start[i] .. start[i]+T-1 of its row, in place (the slack after
        # `capacity` holds it; padding tokens land beyond the row's new end, hidden by `valid` until
        # overwritten); padding rows write nothing. Only `rows` are read.
        hidden, keys, values = model.extend(tokens, positions, mask, keys, values, valid, start,
                                            span=jnp.max(start), block=self.attention_block, rows=rows)
        end = end.at[rows].set(start + n_real, mode="drop")
        last = jnp.take_along_axis(hidden, jnp.maximum(n_real - 1, 0)[:, None, None], axis=1)[:, 0]
        new_logits = model.project(last)
        d = dict(dec)
        old = jnp.take(d["logits"], rows, axis=0, mode="clip")
        d["logits"] = d["logits"].at[rows].set(jnp.where((n_real > 0)[:, None], new_logits, old), mode="drop")
        for name, val in fields.items():
            d[name] = d[name].at[rows].set(val, mode="drop")
        d["length"] = d["length"].at[rows].set(0, mode="drop")
        d["out_tokens"] = d["out_tokens"].at[rows].set(0, mode="drop")
        d["active"] = d["active"].at[rows].set(True, mode="drop")
        return _constrain_state(keys, values, end, d)

    def _decode_impl(self, state, keys, values, end, dec, queued, steps, sel=None):
        """Up to `steps` (traced) tokens for every active row; a row stops at a stop id or its `max_new`.
        With `queued` (a request waits for a slot) the call returns as soon as any row finishes.
        `sel [Bk]` (distinct rows, every active one among them; None: all rows): only those rows are
        computed, their decode state gathered first and scattered back after.

        Each step samples from the row's logits, records token and log-probs at column `length`,
        then feeds the token (its K/V go to slot `end`) to get the next logits.
        """
        self.compile_counts["decode"] += 1
        model = nnx.merge(self.graphdef, state)
        full_end, full_dec = end, dec
        if sel is not None:
            end, dec = end[sel], {k: v[sel] for k, v in dec.items()}
        n_out = dec["out_tokens"].shape[1]
        rows = jnp.arange(end.shape[0])
        sample = jax.vmap(lambda lg, k, t, p: [x[0] for x in sample_token(lg[None], k, t, p)])

        started = dec["active"]

        def cond(carry):
            i, _, _, _, d = carry
            freed = jnp.any(started & ~d["active"])
            return (i < steps) & jnp.any(d["active"]) & ~(queued & freed)

        def body(carry):
            i, keys, values, end, d = carry
            act = d["active"]
            base = jax.vmap(lambda s, a: jax.random.fold_in(jax.random.key(s), a))(d["seed"], d["salt"])
            step_keys = jax.vmap(jax.random.fold_in)(base, d["length"])
            token, raw, logp = sample(d["logits"], step_keys, d["temperature"], d["top_p"])
            col = jnp.minimum(d["length"], n_out - 1)
            d = dict(d)
            for name, val in (("out_tokens", token), ("out_logp", logp), ("out_raw", raw)):
                d[name] = d[name].at[rows, col].set(jnp.where(act, val, d[name][rows, col]))
            length = d["length"] + act.astype(jnp.int32)
            stop = jnp.any(token[:, None] == d["stop_ids"], axis=-1)
            d["length"] = length
            d["active"] = act & ~(stop | (length >= d["max_new"]))
            span = jnp.max(jnp.where(act, end, 0))
            keys, values, hidden = _rows_forward(model, keys, values, end, token[:, None], end[:, None], act[:, None],
                                                 span, self.attention_block, rows=sel)
            end = end + act.astype(jnp.int32)
            d["logits"] = jnp.where(act[:, None], model.project(hidden[:, 0]), d["logits"])
            if sel is None:
                return i + 1, *_constrain_state(keys, values, end, d)
            return (i + 1, constrain(keys, HEAD_MAJOR_CACHE_AXES), constrain(values, HEAD_MAJOR_CACHE_AXES),
                    end, d)

        steps_done, keys, values, end, dec = jax.lax.while_loop(cond, body, (jnp.int32(0), keys, values, end, dec))
        if sel is not None:
            end = full_end.at[sel].set(end)
            dec = {k: full_dec[k].at[sel].set(v) for k, v in dec.items()}
            keys, values, end, dec = _constrain_state(keys, values, end, dec)
        return keys, values, end, dec, steps_done

    # -- public API --------------------------------------------------------------------------------
    def admission_lock(self):
        """The engine's lock as a context manager: requests submitted while it is held are admitted
        together (the engine admits nothing until it is released)."""
        return self._cv

    def submit(self, prompt: Sequence[int], params: SamplingParams = SamplingParams(), *,
               max_new_tokens: int | None = None, episode_id: str | None = None, salt: int = 0) -> Future:
        """Queue one request; the future resolves to its `Completion` (or `RequestCancelled`)."""
        prompt = [int(i) for i in prompt]
        cap = int(params.max_new_tokens if max_new_tokens is None else max_new_tokens)
        self._check(prompt, params, cap)
        fut: Future = Future()
        req = _Request(prompt=prompt, max_new=cap, temperature=float(params.temperature), top_p=float(params.top_p),
                       stop_ids=tuple(params.stop_token_ids), seed=int(params.seed) & 0x7FFFFFFF,
                       salt=int(salt) & 0x7FFFFFFF, episode_id=episode_id, future=fut)
        with self._cv:
            if self._closed:
                raise RuntimeError("EpisodeSampler.submit: the sampler is closed")
            if episode_id is not None and any(q.episode_id == episode_id for q in self._queue):
                raise ValueError(f"EpisodeSampler.submit: episode {episode_id!r} already has a queued request")
            self._queue.append(req)
            self.stats.requests += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="episode-sampler", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return fut

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """`SamplerEngine.generate`: one completion per prompt (one-off rows, nothing cached after)."""
        caps = [params.max_new_tokens] * len(prompts) if max_new_tokens is None else [int(m) for m in max_new_tokens]
        if len(caps) != len(prompts):
            raise ValueError(f"EpisodeSampler.generate: max_new_tokens needs {len(prompts)} entries, got {caps}")
        futures = [self.submit(p, params, max_new_tokens=c, salt=i) for i, (p, c) in enumerate(zip(prompts, caps))]
        return [f.result() for f in futures]

    def end_episode(self, episode_id: str) -> None:
        """The episode ended or was cancelled: free its row, cancel its queued or running request."""
        with self._cv:
            for q in [q for q in self._queue if q.episode_id == episode_id]:
                self._queue.remove(q)
                q.future.set_exception(RequestCancelled(f"episode {episode_id} ended"))
            r = self._row_of.pop(episode_id, None)
            if r is not None:
                row = self._rows[r]
                if row.request is not None:
                    self._cancel_rows.add(r)
                row.episode_id, row.ids = None, []
            self._cv.notify_all()

    def update_weights(self, weights) -> None:
        """New parameters (a `Decoder` or `TrainState.actor_params`): no recompile; every cached
        episode is dropped (its next request prefills its whole context under the new weights).
        Raises while requests are generating (call it between rollouts)."""
        with self._cv:
            busy = sum(r.request is not None for r in self._rows) + len(self._queue)
            if busy:
                raise RuntimeError(f"EpisodeSampler.update_weights: {busy} request(s) in flight; "
                                   "update between rollouts")
            with self._device_lock:
                self.state = replace_weights(self.state, weights)
            for row in self._rows:
                row.episode_id, row.ids = None, []
            self._row_of.clear()

    def cached_episodes(self) -> dict[str, int]:
        """Episode id -> tokens held in its row's cache."""
        with self._cv:
            return {e: len(self._rows[r].ids) for e, r in self._row_of.items()}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- host side ---------------------------------------------------------------------------------
    def _check(self, prompt: list[int], params: SamplingParams, cap: int) -> None:
        if not prompt:
            raise ValueError("EpisodeSampler: every prompt needs at least one token")
        bad = [i for i in prompt if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"EpisodeSampler: prompt has ids {bad[:3]} outside [0, {self.config.vocab_size})")
        if not 1 <= cap <= self.max_new_tokens:
            raise ValueError(f"EpisodeSampler: max_new_tokens={cap} must be in [1, {self.max_new_tokens}] "
                             "(the sampler's max_new_tokens)")
        if len(prompt) + cap > self.cache_len:
            raise ValueError(f"EpisodeSampler: prompt of {len(prompt)} tokens + {cap} new tokens exceeds "
                             f"cache_len={self.cache_len}")
        if params.stop_strings:
            raise ValueError("EpisodeSampler: stop_strings are not supported (use stop_token_ids, or JaxSampler)")
        if len(params.stop_token_ids) > MAX_STOP_IDS:
            raise ValueError(f"EpisodeSampler: at most {MAX_STOP_IDS} stop_token_ids, got {len(params.stop_token_ids)}")

    def _row_for(self, req: _Request) -> int | None:
        """The request's row: its episode's own, a free one, or the least recently used idle one."""
        own = self._row_of.get(req.episode_id) if req.episode_id is not None else None
        if own is not None:
            return own if self._rows[own].request is None else None
        free = [i for i, r in enumerate(self._rows) if r.request is None and r.episode_id is None]
        if free:
            return free[0]
        idle = [i for i, r in enumerate(self._rows) if r.request is None]
        if not idle:
            return None
        victim = min(idle, key=lambda i: self._rows[i].last_used)
        self._row_of.pop(self._rows[victim].episode_id, None)
        self._rows[victim].episode_id, self._rows[victim].ids = None, []
        self.stats.evictions += 1
        return victim

    def _admit(self) -> list[_Request]:
        admitted = []
        for req in list(self._queue):
            r = self._row_for(req)
            if r is None:
                continue
            self._queue.remove(req)
            row = self._rows[r]
            row.request, req.row = req, r
            if req.episode_id is not None:
                row.episode_id = req.episode_id
                self._row_of[req.episode_id] = r
            common = 0
            if self.reuse_cache:
                limit = min(len(row.ids), len(req.prompt) - 1)  # at least one token to prefill (logits)
                while common < limit and row.ids[common] == req.prompt[common]:
                    common += 1
            req.start = common
            row.ids = req.prompt[:common]
            admitted.append(req)
        return admitted

    def _loop(self) -> None:
        with self._mesh_context():
            try:
                self._run()
            except BaseException as exc:  # noqa: BLE001 - delivered to every waiting caller
                with self._cv:
                    self._closed = True
                    for req in list(self._queue) + [r.request for r in self._rows if r.request is not None]:
                        if not req.future.done():
                            req.future.set_exception(exc)
                    self._queue.clear()
                raise

    def _run(self) -> None:
        while True:
            with self._cv:
                t0 = time.perf_counter()
                while not self._closed and not self._queue and not self._cancel_rows and \
                        not any(r.request is not None for r in self._rows):
                    self._cv.wait()
                self.stats.wait_s += time.perf_counter() - t0
                if self._closed:
                    for req in list(self._queue) + [r.request for r in self._rows if r.request is not None]:
                        if not req.future.done():
                            req.future.set_exception(RequestCancelled("the sampler closed"))
                    self._queue.clear()
                    return
                cancel = sorted(self._cancel_rows)
                self._cancel_rows.clear()
                for r in cancel:
                    req = self._rows[r].request
                    if req is not None and not req.future.done():
                        req.future.set_exception(RequestCancelled("episode ended"))
                    self._rows[r].request = None
                admitted = self._admit()
            with self._device_lock:
                if cancel:
                    idx = jnp.asarray(cancel, jnp.int32)
                    self._dec["active"] = self._dec["active"].at[idx].set(False)
                if admitted:
                    self._prefill(admitted)
                active = [i for i, r in enumerate(self._rows) if r.request is not None]
                if active:
                    self._decode_and_retire()

    def _grow(self, needed: int) -> None:
        """Double the per-row capacity until `needed` slots fit (copying the cached K/V)."""
        cap = self.capacity
        while cap < needed:
            cap *= 2
        if cap == self.capacity:
            return
        pad = self._alloc(cap) - self._keys.shape[3]
        widths = ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0))
        grow = jax.jit(lambda k, v: tuple(constrain(jnp.pad(x, widths), HEAD_MAJOR_CACHE_AXES) for x in (k, v)))
        self._keys, self._values = grow(self._keys, self._values)
        self.capacity = cap

    def _groups(self, admitted: list[_Request]) -> list[list[_Request]]:
        """Admitted requests split into prefill calls of a power-of-two number of rows (the binary
        digits of their count, largest first; no padding rows) sorted by cached length, so the
        rows of a call read about the same number of cache blocks. One row per call when
        `batch_invariant`."""
        order = sorted(admitted, key=lambda q: q.start)
        if self.batch_invariant:
            return [[q] for q in order]
        groups, i = [], 0
        for bit in reversed(range(len(order).bit_length())):
            if len(order) >> bit & 1:
                groups.append(order[i:i + (1 << bit)])
                i += 1 << bit
        return groups

    def _prefill(self, admitted: list[_Request]) -> None:
        t0 = time.perf_counter()
        self._grow(max(len(q.prompt) + q.max_new for q in admitted))
        self.stats.prefill_tokens += sum(len(q.prompt) - q.start for q in admitted)
        self.stats.reused_tokens += sum(q.start for q in admitted)
        for group in self._groups(admitted):
            self._prefill_rows(group)
        for q in admitted:
            self._rows[q.row].ids = list(q.prompt)
        jax.block_until_ready(self._dec["logits"])
        self.stats.prefill_s += time.perf_counter() - t0

    def _prefill_rows(self, group: list[_Request]) -> None:
        """One prefill call per `prefill_chunk` tokens of the group's longest appended part."""
        bj, t = len(group), self.prefill_chunk  # one chunk shape: compiles vary only with rows and capacity
        stops = np.full((bj, MAX_STOP_IDS), -1, np.int32)
        for i, q in enumerate(group):
            stops[i, :len(q.stop_ids)] = q.stop_ids
        fields = {"max_new": np.asarray([q.max_new for q in group], np.int32),
                  "temperature": np.asarray([q.temperature for q in group], np.float32),
                  "top_p": np.asarray([q.top_p for q in group], np.float32),
                  "seed": np.asarray([q.seed for q in group], np.int32),
                  "salt": np.asarray([q.salt for q in group], np.int32), "stop_ids": stops}
        row_ids = np.asarray([q.row for q in group], np.int32)
        longest = max(len(q.prompt) - q.start for q in group)
        for c in range(0, longest, t):
            tokens = np.zeros((bj, t), np.int32)
            n_real = np.zeros(bj, np.int32)
            start = np.zeros(bj, np.int32)
            for i, q in enumerate(group):
                chunk = q.prompt[q.start + c:q.start + c + t]
                tokens[i, :len(chunk)] = chunk
                n_real[i], start[i] = len(chunk), min(q.start + c, len(q.prompt))
            self._keys, self._values, self._end, self._dec = self._prefill_fn(
                self.state, self._keys, self._values, self._end, self._dec, row_ids, tokens, n_real, start, fields)

    def precompile(self, capacity: int | None = None) -> dict[str, int]:
        """Grow to `capacity` slots per row (default `cache_len`) and compile every prefill (rows
        1, 2, 4, .. <= slots) and the decode at it, so a rollout at that capacity never compiles.
        Padding rows only: no state changes. Call while idle. Returns `compile_counts`."""
        with self._cv, self._device_lock, self._mesh_context():
            if any(r.request is not None for r in self._rows) or self._queue:
                raise RuntimeError("EpisodeSampler.precompile: requests in flight")
            self._grow(min(int(capacity or self.cache_len), pow2_bucket(self.cache_len, 1)))
            for bit in range(self.slots.bit_length()):
                self._keys, self._values, self._end, self._dec = self._prefill_fn(*self._padding_prefill(1 << bit))
            for n_rows in range(self.row_quantum, self.slots + self.row_quantum, self.row_quantum):
                self._keys, self._values, self._end, self._dec, _ = self.decode_fn(
                    self.state, self._keys, self._values, self._end, self._dec, np.bool_(False),
                    np.int32(self.decode_steps), self._decode_rows(list(range(min(n_rows, self.slots)))))
            jax.block_until_ready(self._keys)
        return dict(self.compile_counts)

    def _padding_prefill(self, bj: int) -> tuple:
        """Arguments of a prefill call of `bj` padding rows (they change nothing)."""
        zeros = np.zeros(bj, np.int32)
        fields = {"max_new": np.ones(bj, np.int32), "temperature": np.ones(bj, np.float32),
                  "top_p": np.ones(bj, np.float32), "seed": zeros, "salt": zeros,
                  "stop_ids": np.full((bj, MAX_STOP_IDS), -1, np.int32)}
        return (self.state, self._keys, self._values, self._end, self._dec, np.full(bj, self.slots, np.int32),
                np.zeros((bj, self.prefill_chunk), np.int32), zeros, zeros, fields)

    def cache_copies(self) -> dict[str, int]:
        """Whole-cache copies in each compiled piece at the current capacity, read off XLA's
        optimised HLO (`prefill` of one row; `decode` of every row and, when rows are bucketed,
        `decode_rows` of the smallest bucket): 0 means the call updates the cache in place. A
        copy is a pass over the whole cache, per call for prefill and per token for decode (XLA
        copied it while nothing but program order put the writes after the reads:
        `Decoder.extend`). A diagnostic for tests and benchmarks; it compiles (the persistent cache
        aside)."""
        shape = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[jnp.dtype(self._keys.dtype).name]
        shape += "[" + ",".join(map(str, self._keys.shape)) + "]"

        def copies(lowered) -> int:
            return sum(shape in line and " copy(" in line for line in lowered.compile().as_text().splitlines())

        decode = (self.state, self._keys, self._values, self._end, self._dec, np.bool_(False),
                  np.int32(self.decode_steps))
        with self._mesh_context():
            out = {"prefill": copies(self._prefill_fn.lower(*self._padding_prefill(1))),
                   "decode": copies(self.decode_fn.lower(*decode, None))}
            rows = self._decode_rows([0])
            if rows is not None:
                out["decode_rows"] = copies(self.decode_fn.lower(*decode, rows))
        return out

    def _decode_rows(self, active: list[int]) -> np.ndarray | None:
        """The rows a decode call computes: `active` (ascending) padded with idle rows to a multiple
        of `row_quantum` (distinct, so every computed row writes only its own cache row), or None
        (every row, one compiled shape) when that is all of them."""
        n = -(-max(len(active), 1) // self.row_quantum) * self.row_quantum
        if n >= self.slots:
            return None
        chosen = set(active)
        pad = [i for i in range(self.slots) if i not in chosen][:n - len(active)]
        return np.asarray(sorted(active + pad), np.int32)

    def _decode_and_retire(self) -> None:
        t0 = time.perf_counter()
        # A free row whose episode is live (in its sandbox) will get a request soon: short calls,
        # so it waits at most `refill_decode_steps` tokens for its row.
        refill = any(r.request is None and r.episode_id is not None for r in self._rows)
        sel = self._decode_rows([i for i, r in enumerate(self._rows) if r.request is not None])
        self._keys, self._values, self._end, self._dec, steps_done = self.decode_fn(
            self.state, self._keys, self._values, self._end, self._dec, np.bool_(bool(self._queue)),
            np.int32(self.refill_decode_steps if refill else self.decode_steps), sel)
        active = np.asarray(self._dec["active"])
        self.stats.decode_calls += 1
        self.stats.decode_steps += int(steps_done)
        self.stats.decode_row_steps += (self.slots if sel is None else len(sel)) * int(steps_done)
        self.stats.decode_slot_steps += self.slots * int(steps_done)
        self.stats.decode_s += time.perf_counter() - t0
        finished = [i for i, r in enumerate(self._rows) if r.request is not None and not active[i]]
        if not finished:
            return
        length = np.asarray(self._dec["length"])
        out_tokens, out_logp, out_raw = (np.asarray(self._dec[k]) for k in ("out_tokens", "out_logp", "out_raw"))
        now = time.monotonic()
        with self._cv:
            for i in finished:
                row = self._rows[i]
                req, row.request = row.request, None
                if req is None:  # cancelled meanwhile
                    continue
                k = int(length[i])
                ids = out_tokens[i, :k].tolist()
                self.stats.generated_tokens += k
                row.ids = row.ids + ids  # every sampled token was fed: its K/V are cached
                row.last_used = now
                if row.episode_id is None:
                    row.ids = []
                reason = "stop_token" if ids and ids[-1] in req.stop_ids else "length"
                if not req.future.done():
                    req.future.set_result(Completion(token_ids=ids, logprobs=out_logp[i, :k].tolist(),
                                                     raw_logprobs=out_raw[i, :k].tolist(), finish_reason=reason))
            self._cv.notify_all()
