"""Batched KV-cache sampling in JAX, compiled for a small set of shape buckets.

Layout: prompts are **left-padded** to a prompt bucket `P`, so every row's last prompt token sits
in slot `P-1` and all rows write the same cache slot each step; generated token `t` of row `r`
has rotary position `len(prompt_r) + t` (the same positions the training forward uses for the
unpadded sequence). Batch size, prompt length and new-token budget are each rounded up to a
bucket (powers of two), so a multi-turn rollout whose prompts grow within a bucket reuses the
compiled prefill and decode functions (`compile_counts` counts traces).

Log-probabilities. `Completion.logprobs[t] = log p(token_t)` under the distribution the token was
actually sampled from: `softmax(logits_t / T)` restricted to the top-p nucleus and renormalised
(0 for greedy, a point mass). These are the behaviour log-probabilities PPO's ratio needs (SPEC §2).
`Completion.raw_logprobs[t] = log softmax(logits_t)[token_t]` (temperature 1, no filtering): what
the trainer's `token_logprobs` recomputes. Training rollouts sample at temperature 1, top-p 1
(`TRAINING_SAMPLING`), where the two are the same numbers; evaluation samples at 0.6 / 0.95
(`EVAL_SAMPLING`, SPEC §6).

Stops: a sequence ends at a stop token (included in its ids), at the token that completes a stop
string (included; checked on the host every `stop_check_steps` tokens), or at its `max_new_tokens`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from typing import Protocol, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from tr.models.decoder import Decoder, KVCache, init_cache
from tr.models.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """`temperature` 0 means greedy; `top_p` 1 disables nucleus filtering."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens} must be >= 1")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if any(not s for s in self.stop_strings):
            raise ValueError("SamplingParams.stop_strings must not contain an empty string")


# (temperature, top_p) of training rollouts (behaviour = raw log-probs) and of evaluation (SPEC §6).
TRAINING_SAMPLING = (1.0, 1.0)
EVAL_SAMPLING = (0.6, 0.95)


@dataclasses.dataclass(frozen=True)
class Completion:
    """Generated ids (stop token included), their log-probs under the distribution sampled from
    (`logprobs`) and under the raw model at temperature 1 (`raw_logprobs`), and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    raw_logprobs: list[float]
    finish_reason: str  # 'stop_token' | 'stop_string' | 'length'

    @property
    def sampling_logprobs(self) -> list[float]:
        """The former name of `logprobs` (log-probs under the processed distribution)."""
        return self.logprobs


class SamplerEngine(Protocol):
    """The interface the rollout uses; `JaxSampler` and `VllmEngine` implement it."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]: ...


def pow2_bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    size = minimum
    while size < n:
        size *= 2
    return size


def sample_token(logits: Float[Array, "b v"], key: jax.Array, temperature: Float[Array, ""],
                 top_p: Float[Array, ""]) -> tuple[Int[Array, "b"], Float[Array, "b"], Float[Array, "b"]]:
    """Sample from `softmax(logits / T)` restricted to the top-p nucleus (greedy when T == 0).

    The nucleus keeps, in decreasing probability, every token whose preceding mass is < top_p
    (top_p >= 1 keeps every token, so T = 1, top-p = 1 samples the raw softmax exactly).
    Returns `(token, log softmax(logits)[token], log p_processed[token])`; the processed
    log-prob of a greedy pick is 0 (a point mass).
    """
    chex.assert_rank(logits, 2)
    logits = logits.astype(jnp.float32)
    raw_logp = jax.nn.log_softmax(logits, axis=-1)
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)
    probs = jax.nn.softmax(scaled, axis=-1)
    sorted_probs = -jnp.sort(-probs, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    kept = (mass_before < top_p) | (top_p >= 1.0)
    threshold = jnp.min(jnp.where(kept, sorted_probs, jnp.inf), axis=-1, keepdims=True)
    filtered = jnp.where(probs >= threshold, scaled, -jnp.inf)
    sampled = jax.random.categorical(key, filtered, axis=-1)
    token = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    proc_logp = jnp.where(greedy, 0.0, jnp.take_along_axis(jax.nn.log_softmax(filtered, -1), token[:, None], -1)[:, 0])
    behaviour = jnp.take_along_axis(raw_logp, token[:, None], -1)[:, 0]
    return token, behaviour, proc_logp


def replace_weights(state: nnx.State, weights) -> nnx.State:
    """`state` with the parameters of `weights` (a `Decoder` or a pure dict as `nnx.to_pure_dict`
    gives); raises ValueError naming the first leaf whose shape or dtype differs (a recompile)."""
    if isinstance(weights, nnx.Module):
        new = nnx.state(weights)
    elif isinstance(weights, (dict, nnx.State)):
        new = jax.tree.map(lambda x: x, state)
        try:
            nnx.replace_by_pure_dict(new, weights.to_pure_dict() if isinstance(weights, nnx.State) else weights)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"update_weights: the parameter dict does not fit the sampler's model: {exc}") from exc
    else:
        raise ValueError(f"update_weights: expected a Decoder or a pure parameter dict, got {type(weights).__name__}")
    old_leaves = jax.tree_util.tree_leaves_with_path(state)
    new_leaves = jax.tree_util.tree_leaves_with_path(new)
    if [p for p, _ in old_leaves] != [p for p, _ in new_leaves]:
        raise ValueError("update_weights: the new parameters have a different structure than the sampler's model")
    for (path, a), (_, b) in zip(old_leaves, new_leaves):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"update_weights: {jax.tree_util.keystr(path)} is {b.dtype}{list(b.shape)}, "
                             f"the sampler's model has {a.dtype}{list(a.shape)}")
    return new


class JaxSampler:
    """KV-cache sampler for a `Decoder` (see the module docstring for padding and buckets)."""

    def __init__(self, model: Decoder, tokenizer: Tokenizer | None = None, *, min_prompt_bucket: int = 64,
                 min_new_bucket: int = 16, min_batch_bucket: int = 1, stop_check_steps: int = 32,
                 mesh: jax.sharding.Mesh | None = None):
        self.mesh = mesh  # a sharded model: run under this mesh so activation constraints apply
        self.graphdef, self.state = nnx.split(model)
        self.config = model.config
        self.tokenizer = tokenizer
        self.min_prompt_bucket = min_prompt_bucket
        self.min_new_bucket = min_new_bucket
        self.min_batch_bucket = min_batch_bucket
        self.stop_check_steps = stop_check_steps
        self.compile_counts: Counter[str] = Counter()
        # the jitted prefill and decode calls (public: a benchmark wraps them to time them)
        self.prefill_fn = jax.jit(self._prefill_impl, static_argnames=("cache_len",))
        self.decode_fn = jax.jit(self._decode_impl, donate_argnames=("cache",))

    def update_weights(self, weights) -> None:
        """Use new parameters: a `Decoder` or its pure parameter dict (`TrainState.actor_params`).

        Shapes and dtypes must match the current ones (checked), so nothing recompiles.
        """
        self.state = replace_weights(self.state, weights)

    # -- compiled pieces ---------------------------------------------------------------------
    def _prefill_impl(self, state, tokens, positions, mask, *, cache_len: int):
        self.compile_counts["prefill"] += 1  # runs only while tracing
        model = nnx.merge(self.graphdef, state)
        cache = init_cache(self.config, tokens.shape[0], cache_len)
        hidden, cache = model.hidden_states(tokens, positions, cache=cache, token_mask=mask)
        return cache, model.project(hidden[:, -1])

    def _decode_impl(self, state, cache: KVCache, logits, out_tokens, out_logp, out_slp, lengths, done,
                     next_pos, max_new, stop_ids, key, temperature, top_p, step_limit):
        """Steps until every row is done or `lengths` reach `step_limit`; all state in the carry."""
        self.compile_counts["decode"] += 1
        model = nnx.merge(self.graphdef, state)
        n_out = out_tokens.shape[1]

        def cond(carry):
            _, _, _, _, _, lengths, done, _ = carry
            return jnp.any(~done & (lengths < step_limit))

        def body(carry):
            cache, logits, out_tokens, out_logp, out_slp, lengths, done, next_pos = carry
            active = ~done & (lengths < step_limit)
            step_key = jax.random.fold_in(key, jnp.max(jnp.where(active, lengths, 0)))
            token, logp, slp = sample_token(logits, step_key, temperature, top_p)
            rows = jnp.arange(token.shape[0])
            col = jnp.minimum(lengths, n_out - 1)
            out_tokens = out_tokens.at[rows, col].set(jnp.where(active, token, out_tokens[rows, col]))
            out_logp = out_logp.at[rows, col].set(jnp.where(active, logp, out_logp[rows, col]))
            out_slp = out_slp.at[rows, col].set(jnp.where(active, slp, out_slp[rows, col]))
            lengths = lengths + active.astype(jnp.int32)
            is_stop = jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
            done = done | (active & (is_stop | (lengths >= max_new)))
            hidden, cache = model.hidden_states(token[:, None], next_pos[:, None], cache=cache)
            next_pos = next_pos + 1
            return cache, model.project(hidden[:, -1]), out_tokens, out_logp, out_slp, lengths, done, next_pos

        carry = (cache, logits, out_tokens, out_logp, out_slp, lengths, done, next_pos)
        return jax.lax.while_loop(cond, body, carry)

    # -- host driver -------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """Sample one completion per prompt (token ids in, token ids out)."""
        with (jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()):
            return self._generate(prompts, params, max_new_tokens)

    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                  max_new_tokens: Sequence[int] | None) -> list[Completion]:
        n = len(prompts)
        if n == 0:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("JaxSampler.generate: every prompt needs at least one token")
        caps = [params.max_new_tokens] * n if max_new_tokens is None else [int(m) for m in max_new_tokens]
        if len(caps) != n or min(caps) < 1:
            raise ValueError(f"JaxSampler.generate: max_new_tokens needs {n} positive entries, got {caps}")
        vocab = self.config.vocab_size
        for r, p in enumerate(prompts):
            bad = [int(i) for i in p if not 0 <= int(i) < vocab]
            if bad:
                raise ValueError(f"JaxSampler.generate: prompt {r} has ids {bad[:3]} outside [0, {vocab})")
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("JaxSampler.generate: stop_strings need the sampler to have a tokenizer")

        batch = pow2_bucket(n, self.min_batch_bucket)
        p_len = pow2_bucket(max(len(p) for p in prompts), self.min_prompt_bucket)
        n_new = pow2_bucket(max(caps), self.min_new_bucket)
        if p_len + n_new > self.config.max_seq_len:
            raise ValueError(f"JaxSampler.generate: prompt bucket {p_len} + new-token bucket {n_new} exceeds "
                             f"max_seq_len={self.config.max_seq_len} of model {self.config.name!r}")

        tokens = np.zeros((batch, p_len), np.int32)
        mask = np.zeros((batch, p_len), bool)
        positions = np.zeros((batch, p_len), np.int32)
        lengths_prompt = np.ones(batch, np.int32)
        for r in range(batch):
            ids = np.asarray(prompts[r] if r < n else [0], np.int32)
            tokens[r, p_len - len(ids):] = ids
            mask[r, p_len - len(ids):] = True
            positions[r, p_len - len(ids):] = np.arange(len(ids))
            lengths_prompt[r] = len(ids)
        cache, logits = self.prefill_fn(self.state, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask),
                                      cache_len=p_len + n_new)

        max_new = np.ones(batch, np.int32)
        max_new[:n] = caps
        done = np.arange(batch) >= n
        stop_ids = np.asarray(params.stop_token_ids or (-1,), np.int32)
        carry = (cache, logits, jnp.zeros((batch, n_new), jnp.int32), jnp.zeros((batch, n_new), jnp.float32),
                 jnp.zeros((batch, n_new), jnp.float32), jnp.zeros(batch, jnp.int32), jnp.asarray(done),
                 jnp.asarray(lengths_prompt))
        key = jax.random.key(params.seed)
        temperature, top_p = jnp.float32(params.temperature), jnp.float32(params.top_p)
        step = self.stop_check_steps if params.stop_strings else n_new
        reasons = ["length"] * n
        limit = 0
        while True:
            limit = min(limit + step, n_new)
            carry = self.decode_fn(self.state, *carry[:7], carry[7], jnp.asarray(max_new), jnp.asarray(stop_ids),
                                 key, temperature, top_p, jnp.int32(limit))
            lengths, done_now = np.array(carry[5]), np.array(carry[6])
            if params.stop_strings:
                out_tokens = np.asarray(carry[2])
                for r in range(n):
                    if reasons[r] != "length":
                        continue
                    cut = self._stop_string_end(out_tokens[r, : lengths[r]], params.stop_strings)
                    if cut is not None:
                        reasons[r] = "stop_string"
                        lengths[r] = cut
                        done_now[r] = True
                carry = carry[:5] + (jnp.asarray(lengths), jnp.asarray(done_now), carry[7])
            if done_now.all() or limit >= n_new:
                break

        out_tokens, out_logp, out_slp = (np.asarray(a) for a in carry[2:5])
        completions = []
        stop_set = set(params.stop_token_ids)
        for r in range(n):
            k = int(lengths[r])
            ids = out_tokens[r, :k].tolist()
            reason = reasons[r]
            if reason == "length" and ids and ids[-1] in stop_set:
                reason = "stop_token"
            completions.append(Completion(token_ids=ids, logprobs=out_slp[r, :k].tolist(),
                                          raw_logprobs=out_logp[r, :k].tolist(), finish_reason=reason))
        return completions

    def _stop_string_end(self, ids: np.ndarray, stop_strings: tuple[str, ...]) -> int | None:
        """Number of tokens up to and including the one that completes the first stop string."""
        text = self.tokenizer.decode(ids.tolist())
        if not any(s in text for s in stop_strings):
            return None
        lo, hi = 1, len(ids)  # smallest k with a stop string inside decode(ids[:k]) (monotone in k)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self.tokenizer.decode(ids[:mid].tolist()) for s in stop_strings):
                hi = mid
            else:
                lo = mid + 1
        return lo
