"""Qwen3 decoder in flax.nnx: RMSNorm, rotary embeddings, grouped-query attention with q/k RMSNorm,
SwiGLU MLP, tied or untied embeddings, a KV cache for decoding, and chunked token log-probs.

Conventions follow Hugging Face `Qwen3ForCausalLM` exactly (so `weights.py` can load real
checkpoints): `RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)` in float32; rotary embedding with the
"rotate half" layout (`x * cos + rotate_half(x) * sin`, frequencies `theta^(-2i/d)` repeated over
the two halves); q/k RMSNorm over `head_dim` applied per head before the rotation; attention scale
`1/sqrt(head_dim)`; MLP `down(silu(gate(x)) * up(x))`.

Parameters carry logical axis names (`logical_axes` metadata, see `sharding.py`); activations are
constrained by logical names through `sharding.constrain`.

**Stacked layers.** The `n_layers` blocks are ONE `Block` module whose parameters carry a leading
layer axis (`layers.mlp.gate_proj` is `[n_layers, d_model, d_ff]`, logical axes
`('layers', 'embed', 'mlp')`), created with `nnx.vmap` (each layer its own random init). The forward
runs them with `jax.lax.scan` over that axis (`config.scan_layers`, the default: one traced block,
so compile time does not grow with depth) or, with `scan_layers=False`, as an unrolled Python loop
over the same stacked parameters (the reference form; equal to the scan up to float rounding).
`config.remat` names the rematerialisation policy of each block in the training forward
(`REMAT_POLICIES`); decoding with a cache never rematerialises.

**KV cache layout** (`KVCache`, `init_cache`):

    keys, values  [n_layers, B, S, n_kv_heads, head_dim]   compute dtype; slot s of row b, layer l
    valid         [B, S] bool                               slot holds a real token (not padding)
    end           [] int32                                  next slot written (shared by all rows)

`hidden_states(tokens [B, T], positions, cache=cache, token_mask=m)` writes the T new tokens' keys
and values into slots `end .. end+T-1` of every layer (in place: `dynamic_update_slice` on the
layer-stacked arrays carried through the scan), sets `valid[:, end:end+T] = m`, and lets query
`end + t` attend to every valid slot `<= end + t`; it returns the cache with `end + T`. Logical axes:
`('cache_layers', 'cache_batch', 'cache_length', 'cache_kv_heads', 'activation_head_dim')`
(`CACHE_AXES`); `KVCache.logical_axes()` gives the tree for sharding a cache. The head-major cache
that `Decoder.extend` reads (`[n_layers, B, K, S, head_dim]`) has the same names in its own order
(`HEAD_MAJOR_CACHE_AXES`).
"""

from __future__ import annotations

import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Bool, Float, Int

from tr.models.config import ModelConfig
from tr.models.sharding import constrain, logical_to_spec

_INIT_STD = 0.02

# Remat policy names (`ModelConfig.remat`) -> what a block keeps for the backward pass.
# Names tagged with `checkpoint_name` below: q_proj, k_proj, v_proj (projections before the
# rotation), attention_out (attention output before o_proj).
REMAT_POLICIES: dict[str, Any] = {
    "none": None,                                                         # keep everything
    "full": jax.checkpoint_policies.nothing_saveable,                     # keep block inputs only
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep weight matmuls
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names("q_proj", "k_proj", "v_proj"),
    "save_attention_out": jax.checkpoint_policies.save_only_these_names(
        "q_proj", "k_proj", "v_proj", "attention_out"),
}

CACHE_AXES = ("cache_layers", "cache_batch", "cache_length", "cache_kv_heads", "activation_head_dim")
# The head-major cache `Decoder.extend` reads (`[n_layers, B, K, S, head_dim]`, tr/sampling/slots.py).
HEAD_MAJOR_CACHE_AXES = ("cache_layers", "cache_batch", "cache_kv_heads", "cache_length", "activation_head_dim")


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype: Any,
           init: str = "normal") -> nnx.Param:
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = (jax.random.normal(rngs.params(), shape, jnp.float32) * _INIT_STD).astype(dtype)
    return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
    """`y = w * x / sqrt(mean(x^2, -1) + eps)`, computed in float32."""

    def __init__(self, dim: int, eps: float, dtype: Any, *, rngs: nnx.Rngs):
        self.eps = eps
        self.weight = _param(rngs, (dim,), ("norm",), dtype, init="ones")

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (self.weight.get_value().astype(jnp.float32) * normed).astype(x.dtype)


def rope_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies `ω [head_dim/2]` and the cos/sin scale `m` of the rotary embedding.

    Default: `ω_i = θ^(-2i/d)`, `m = 1` (d = head_dim, i = 0 .. d/2-1).
    YaRN (`rope_scaling='yarn'`, Peng et al. 2023, as Hugging Face computes it), with scale `s`,
    pre-training length `L0`, `β_fast`, `β_slow`:

        corr(r) = d ln(L0 / (2π r)) / (2 ln θ)                 dimension that turns r times over L0
        lo = max(⌊corr(β_fast)⌋, 0),  hi = min(⌈corr(β_slow)⌉, d - 1)   (no ⌊⌋/⌈⌉ if not truncate)
        γ_i = 1 - clip((i - lo) / (hi - lo), 0, 1)             1: keep (high frequency), 0: interpolate
        ω'_i = γ_i ω_i + (1 - γ_i) ω_i / s
        m = attention factor, default 0.1 ln s + 1 (1 when s <= 1)

    and cos/sin are multiplied by `m`.
    """
    d, theta = config.head_dim, config.rope_theta
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if config.rope_scaling == "none":
        return inv_freq.astype(np.float32), 1.0
    s = config.rope_factor
    original = config.rope_original_max_len or config.max_seq_len

    def corr(rotations: float) -> float:
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = corr(config.rope_beta_fast), corr(config.rope_beta_slow)
    if config.rope_truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    keep = 1.0 - np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    scaled = keep * inv_freq + (1.0 - keep) * inv_freq / s
    factor = config.rope_attention_factor or (0.1 * math.log(s) + 1.0 if s > 1 else 1.0)
    return scaled.astype(np.float32), float(factor)


def rotary_cos_sin(positions: Int[Array, "b l"], config: ModelConfig
                   ) -> tuple[Float[Array, "b l d"], Float[Array, "b l d"]]:
    """cos/sin tables: angle[b, l, j] = positions[b, l] * ω[j mod d/2], times `m` (`rope_frequencies`)."""
    inv_freq, scale = rope_frequencies(config)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def apply_rotary(x: Float[Array, "b l h d"], cos: Float[Array, "b l d"], sin: Float[Array, "b l d"]
                 ) -> Float[Array, "b l h d"]:
    """`x * cos + rotate_half(x) * sin` with `rotate_half([x1, x2]) = [-x2, x1]`."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


@struct.dataclass
class KVCache:
    """Layer-stacked keys/values `[n_layers, B, S, K, head_dim]`, slot validity `[B, S]`, next slot `end`.

    All rows write the same slots (prompts are left-padded to a common length), so one scalar
    `end` indexes the batch; `valid` marks the slots holding real tokens. `keys[l]` is layer l's
    `[B, S, K, head_dim]` block. See the module docstring for how `hidden_states` updates it.
    """

    keys: jax.Array
    values: jax.Array
    valid: jax.Array
    end: jax.Array

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    @staticmethod
    def logical_axes() -> "KVCache":
        """The cache's logical axis names, as a KVCache-shaped tree (for `sharding.logical_to_spec`)."""
        return KVCache(keys=CACHE_AXES, values=CACHE_AXES, valid=("cache_batch", "cache_length"),
                       end=())


def init_cache(config: ModelConfig, batch: int, length: int) -> KVCache:
    """An empty cache with `length` slots for `batch` rows (all layers in one array)."""
    shape = (config.n_layers, batch, length, config.n_kv_heads, config.head_dim)
    return KVCache(keys=jnp.zeros(shape, config.compute_dtype), values=jnp.zeros(shape, config.compute_dtype),
                   valid=jnp.zeros((batch, length), bool), end=jnp.zeros((), jnp.int32))


@struct.dataclass
class AttentionMask:
    """Who may attend to whom, without materialising `[B, T, S]`: query `i` sees key `j` iff

        key_slot[j] <= query_slot[i]  and  query_segment[b, i] == key_segment[b, j]  and  key_valid[b, j]

    (causal within a packed segment; with a cache, slots are cache positions and `key_valid` marks
    slots holding real tokens). `dense(rows)` builds the boolean mask of some query rows.
    `self_causal` (static): queries and keys are the same T tokens, `query_slot = key_slot =
    arange(T)`, so query i sees no key after i (`attend` then skips the blocks above the diagonal).
    """

    query_slot: jax.Array      # [T] int32
    key_slot: jax.Array        # [S] int32
    query_segment: jax.Array   # [B, T] int32
    key_segment: jax.Array     # [B, S] int32
    key_valid: jax.Array       # [B, S] bool
    self_causal: bool = struct.field(pytree_node=False, default=False)

    def keys_before(self, n: int) -> "AttentionMask":
        """The mask restricted to the first `n` keys."""
        return self.replace(key_slot=self.key_slot[:n], key_segment=self.key_segment[:, :n],
                            key_valid=self.key_valid[:, :n])

    def dense(self, query_slot: jax.Array | None = None, query_segment: jax.Array | None = None
              ) -> Bool[Array, "b t s"]:
        qs = self.query_slot if query_slot is None else query_slot
        qseg = self.query_segment if query_segment is None else query_segment
        return ((self.key_slot[None, None, :] <= qs[..., :, None])
                & (qseg[:, :, None] == self.key_segment[:, None, :]) & self.key_valid[:, None, :])


def _attend_dense(q, k, v, mask):
    """`softmax(q k^T / sqrt(d) + mask) v` for grouped-query heads, logits in float32."""
    b, t, h, d = q.shape
    n_kv = k.shape[2]
    qg = q.reshape(b, t, n_kv, h // n_kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = scores * (d ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


def _length_shards(length: int) -> int:
    """Devices the query (activation_length) axis is split over under the active mesh and rules."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    spec = logical_to_spec(("activation_length",), (length,), dict(mesh.shape))
    axes = spec[0] if isinstance(spec[0], tuple) else (() if spec[0] is None else (spec[0],))
    return math.prod(mesh.shape[a] for a in axes)


def attend(q: Float[Array, "b t h d"], k: Float[Array, "b s k d"], v: Float[Array, "b s k d"],
           mask: AttentionMask, *, query_chunk: int = 0, keep_blocks: bool = False) -> Float[Array, "b t h d"]:
    """Grouped-query softmax attention: `softmax(q k^T / sqrt(d) + mask) v`, logits in float32.

    `query_chunk > 0` computes it `query_chunk` queries at a time (each block rematerialised in the
    backward pass unless `keep_blocks`), so at most `[B, H, query_chunk, S]` scores exist at once
    instead of `[B, H, T, S]`: exact up to float rounding. With a `self_causal` mask on one shard,
    block i reads only the keys `< (i + 1) * query_chunk` (the blocks above the diagonal are all
    masked): about half the work of the dense form (gym model, 8 rows x 1,024 tokens on 2 CPU
    cores: an SFT step 3.7 s dense, 2.2 s in blocks of 128 over every key, 2.1 s skipping, 2.0 s
    keeping the blocks for the backward; a critic step 2.5 -> 2.1 s keeping them; smaller blocks
    keep the scores in cache, most of the gain). Otherwise blocks are taken inside each shard of a
    context-parallel query axis (block i of every shard together, `lax.map`), so the map never
    crosses devices. `keep_blocks` (a model without remat) keeps each block's probabilities for the
    backward pass instead of recomputing them.
    """
    b, t = q.shape[:2]
    shards = _length_shards(t)
    local = t // shards
    chunk = math.gcd(local, query_chunk) if query_chunk else local
    if chunk >= local:
        return _attend_dense(q, k, v, mask.dense())
    n = local // chunk
    if mask.self_causal and shards == 1:
        def causal_block(q_block, k_block, v_block, slots, segments, block_mask):
            return _attend_dense(q_block, k_block, v_block, block_mask.dense(slots, segments))

        if not keep_blocks:
            causal_block = jax.checkpoint(causal_block)
        outs = []
        for i in range(n):
            rows, keys = slice(i * chunk, (i + 1) * chunk), (i + 1) * chunk
            outs.append(causal_block(q[:, rows], k[:, :keys], v[:, :keys], mask.query_slot[rows],
                                     mask.query_segment[:, rows], mask.keys_before(keys)))
        return jnp.concatenate(outs, axis=1)

    def blocks(x):  # [b, t, ...] -> [n, b, shards * chunk, ...]; block i = chunk i of every shard
        x = x.reshape(x.shape[0], shards, n, chunk, *x.shape[2:])
        return jnp.moveaxis(x, 2, 0).reshape(n, x.shape[0], shards * chunk, *x.shape[4:])

    def one(args):
        q_block, slot_block, segment_block = args
        return _attend_dense(q_block, k, v, mask.dense(slot_block[0], segment_block))

    slots = jnp.broadcast_to(mask.query_slot, (1, t))
    out = jax.lax.map(jax.checkpoint(one), (blocks(q), blocks(slots), blocks(mask.query_segment)))
    out = out.reshape(n, b, shards, chunk, *out.shape[3:])
    return jnp.moveaxis(out, 0, 2).reshape(q.shape)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c, dt = config, config.weight_dtype
        self.config = config
        self.q_proj = _param(rngs, (c.d_model, c.n_heads, c.head_dim), ("embed", "q_heads", "head_dim"), dt)
        self.k_proj = _param(rngs, (c.d_model, c.n_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), dt)
        self.v_proj = _param(rngs, (c.d_model, c.n_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), dt)
        self.o_proj = _param(rngs, (c.n_heads, c.head_dim, c.d_model), ("q_heads", "head_dim", "embed"), dt)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps, dt, rngs=rngs)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps, dt, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                 cache_kv: tuple[jax.Array, jax.Array] | None, layer: jax.Array | int,
                 end: jax.Array | None) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Attention of layer `layer`; `cache_kv` is the layer-STACKED (keys, values) or None."""
        dt = self.config.compute_dtype
        q = checkpoint_name(jnp.einsum("btd,dhk->bthk", x, self.q_proj.get_value().astype(dt)), "q_proj")
        k = checkpoint_name(jnp.einsum("btd,dhk->bthk", x, self.k_proj.get_value().astype(dt)), "k_proj")
        v = checkpoint_name(jnp.einsum("btd,dhk->bthk", x, self.v_proj.get_value().astype(dt)), "v_proj")
        q = apply_rotary(self.q_norm(q), cos, sin)
        k = apply_rotary(self.k_norm(k), cos, sin)
        q = constrain(q, ("activation_batch", "activation_length", "activation_heads", "activation_head_dim"))
        new_kv = None
        if cache_kv is not None:
            cache_k, cache_v = cache_kv
            zero = jnp.zeros((), jnp.int32)
            at = (jnp.asarray(layer, jnp.int32), zero, end, zero, zero)
            cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype)[None], at)
            cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype)[None], at)
            cache_k, cache_v = constrain(cache_k, CACHE_AXES), constrain(cache_v, CACHE_AXES)
            new_kv = (cache_k, cache_v)
            k, v = cache_k[layer], cache_v[layer]
        kv_axes = ("activation_batch", "activation_kv_length", "activation_kv_heads", "activation_head_dim")
        k, v = constrain(k, kv_axes), constrain(v, kv_axes)
        out = checkpoint_name(attend(q, k, v, mask, query_chunk=self.config.attention_chunk,
                                     keep_blocks=self.config.remat == "none"), "attention_out")
        y = jnp.einsum("bthk,hkd->btd", out, self.o_proj.get_value().astype(dt))
        return y, new_kv

    def extend(self, x: jax.Array, cos: jax.Array, sin: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
               valid: jax.Array, new_mask: jax.Array, span: jax.Array, block: int, rows: jax.Array | None,
               write_at: jax.Array, layer: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Attention of new tokens after a head-major cache, layer `layer` of the stacked
        `[n_layers, B, K, S, head_dim]` (`Decoder.extend`): the new tokens' K/V are written at
        slots `write_at[b] ..` of the layer (`_write_rows`), then query t sees the valid cached
        slots `< span` and the new tokens `new_mask[b, t]` allows; returns (y, cache_k, cache_v)."""
        dt = self.config.compute_dtype
        q = jnp.einsum("btd,dhk->bthk", x, self.q_proj.get_value().astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.k_proj.get_value().astype(dt))
        v = jnp.einsum("btd,dhk->bthk", x, self.v_proj.get_value().astype(dt))
        q = apply_rotary(self.q_norm(q), cos, sin)
        k = apply_rotary(self.k_norm(k), cos, sin).astype(cache_k.dtype)
        v = v.astype(cache_v.dtype)
        q = constrain(q, ("activation_batch", "activation_length", "activation_heads", "activation_head_dim"))
        b, t, h, d = q.shape
        n_kv = k.shape[2]
        qg = q.reshape(b, t, n_kv, h // n_kv, d).transpose(0, 2, 3, 1, 4) * (d ** -0.5)   # [b, k, g, t, d]
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)                         # [b, K, t, d]
        cache_k, cache_v = _write_rows((cache_k, cache_v), (k, v), layer, rows, write_at)
        out = _attend_online(qg, cache_k, cache_v, layer, valid, span, block, rows, k, v, new_mask)
        out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
        y = jnp.einsum("bthk,hkd->btd", out, self.o_proj.get_value().astype(dt))
        return y, cache_k, cache_v


def _write_rows(cache, new, layer, rows, write_at):
    """`cache[layer, rows[i], :, write_at[i] : write_at[i] + t] = new[i]` for each query row i, in
    place (one `dynamic_update_slice` per row: a scatter cost a pass over the whole cache); a row
    index `>= B` (padding) writes nothing. cache: (keys, values) `[n_layers, B, K, S, d]`, new:
    (k, v) `[b, K, t, d]`. The slots written lie at or beyond the row's valid end, so `valid` hides
    them from this layer's read (the new tokens are attended through `new`)."""
    n_rows = cache[0].shape[1]
    zero = jnp.zeros((), jnp.int32)
    layer = jnp.asarray(layer, jnp.int32)

    def write(i, kv):
        row = i if rows is None else rows[i]
        at = (layer, jnp.minimum(row, n_rows - 1), zero, write_at[i], zero)
        out = []
        for c, n in zip(kv, new):
            piece = jax.lax.dynamic_slice_in_dim(n, i, 1, axis=0)[None].astype(c.dtype)   # [1, 1, K, t, d]
            if rows is not None:                                   # padding rows keep what is there
                piece = jnp.where(row < n_rows, piece, jax.lax.dynamic_slice(c, at, piece.shape))
            out.append(jax.lax.dynamic_update_slice(c, piece, at))
        return tuple(out)

    return jax.lax.fori_loop(0, new[0].shape[0], write, tuple(cache))


def _attend_online(qg, cache_k, cache_v, layer, valid, span, block, rows, new_k, new_v, new_mask):
    """`softmax(q [k_cache; k_new]^T) [v_cache; v_new]` over the cached slots `< span` (in blocks of
    `block` slots, online softmax: running max `m`, normaliser `l`, accumulator) and the new tokens.

    qg `[b, K, g, t, d]` (pre-scaled), cache_k/v `[n_layers, B, K, S, d]`, of which layer `layer`
    is read one block at a time (never sliced whole: no copy of the layer) (query row i reads cache row
    `rows[i]`, clipped; all B in order when None), valid `[b, S]`, new_k/v `[b, K, t, d]`, new_mask
    `[b, t, t]`. Exact up to rounding; reads `ceil(span / block)` blocks, not all `S` slots.
    """
    b, n_kv, g, t, d = qg.shape
    _, n_rows, _, s, _ = cache_k.shape
    f32 = jnp.float32
    zero = jnp.zeros((), jnp.int32)

    def take(x, start, size):                      # -> the query rows' [b, K, size, d] of layer `layer`
        at = (jnp.asarray(layer, jnp.int32), zero, zero, jnp.asarray(start, jnp.int32), zero)
        x = jax.lax.dynamic_slice(x, at, (1, n_rows, n_kv, size, d))[0]
        return x if rows is None else jnp.take(x, rows, axis=0, mode="clip")

    def update(carry, keys, vals, mask):          # mask [b, t, n]
        m, l, acc = carry
        scores = jnp.einsum("bkgtd,bknd->bkgtn", qg, keys, preferred_element_type=f32)
        mask = mask[:, None, None]
        m_new = jnp.maximum(m, jnp.max(jnp.where(mask, scores, low), axis=-1))   # finite: no inf - inf
        p = jnp.where(mask, jnp.exp(scores - m_new[..., None]), 0.0)
        scale = jnp.exp(m - m_new)
        l = l * scale + p.sum(-1)
        acc = acc * scale[..., None] + jnp.einsum("bkgtn,bknd->bkgtd", p.astype(vals.dtype), vals,
                                                  preferred_element_type=f32)
        return m_new, l, acc

    low = jnp.finfo(f32).min
    init = (jnp.full((b, n_kv, g, t), low, f32), jnp.zeros((b, n_kv, g, t), f32),
            jnp.zeros((b, n_kv, g, t, d), f32))
    if block <= 0 or s <= block or s % block:
        carry = update(init, take(cache_k, 0, s), take(cache_v, 0, s), jnp.broadcast_to(valid[:, None, :], (b, t, s)))
    else:
        def body(i, carry):
            start = i * block
            keys, vals = take(cache_k, start, block), take(cache_v, start, block)
            mask = jax.lax.dynamic_slice_in_dim(valid, start, block, axis=1)
            return update(carry, keys, vals, jnp.broadcast_to(mask[:, None, :], (b, t, block)))

        n_blocks = jnp.clip((span + block - 1) // block, 1, s // block)
        carry = jax.lax.fori_loop(0, n_blocks, body, init)
    m, l, acc = update(carry, new_k, new_v, new_mask)
    return (acc / jnp.where(l > 0, l, 1.0)[..., None]).astype(qg.dtype)   # l = 0: a query seeing nothing


class MLP(nnx.Module):
    """SwiGLU: `down(silu(x W_gate) * (x W_up))`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c, dt = config, config.weight_dtype
        self.config = config
        self.gate_proj = _param(rngs, (c.d_model, c.d_ff), ("embed", "mlp"), dt)
        self.up_proj = _param(rngs, (c.d_model, c.d_ff), ("embed", "mlp"), dt)
        self.down_proj = _param(rngs, (c.d_ff, c.d_model), ("mlp", "embed"), dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = self.config.compute_dtype
        gate = x @ self.gate_proj.get_value().astype(dt)
        up = x @ self.up_proj.get_value().astype(dt)
        h = constrain(jax.nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp"))
        return h @ self.down_proj.get_value().astype(dt)


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        dt = config.weight_dtype
        self.input_layernorm = RMSNorm(config.d_model, config.rms_eps, dt, rngs=rngs)
        self.self_attn = Attention(config, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.rms_eps, dt, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, cos, sin, mask, cache_kv, layer, end):
        attn_out, new_kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache_kv, layer, end)
        x = x + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x))
        x = constrain(x, ("activation_batch", "activation_length", "activation_embed"))
        return x, new_kv

    def extend(self, x, cos, sin, cache_k, cache_v, valid, new_mask, span, block, rows, write_at, layer):
        attn_out, cache_k, cache_v = self.self_attn.extend(
            self.input_layernorm(x), cos, sin, cache_k, cache_v, valid, new_mask, span, block, rows, write_at, layer)
        x = x + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x))
        x = constrain(x, ("activation_batch", "activation_length", "activation_embed"))
        return x, cache_k, cache_v


def positions_from_segments(segment_ids: Int[Array, "b l"]) -> Int[Array, "b l"]:
    """Position of each token within its segment (restarts at 0 where the segment id changes)."""
    length = segment_ids.shape[1]
    index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), segment_ids.shape)
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start_index = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return index - start_index


def stacked_blocks(config: ModelConfig, rngs: nnx.Rngs) -> Block:
    """`n_layers` blocks as one `Block` whose parameters have a leading `'layers'` axis."""

    @nnx.split_rngs(splits=config.n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=config.n_layers,
              transform_metadata={nnx.PARTITION_NAME: None, "logical_axes": "layers"})
    def make(layer_rngs: nnx.Rngs) -> Block:
        return Block(config, rngs=layer_rngs)

    return make(rngs)


class Decoder(nnx.Module):
    """Qwen3 causal decoder. `lm_head=False` builds the backbone only (the critic's trunk)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, lm_head: bool = True):
        dt = config.weight_dtype
        self.config = config
        self.embed_tokens = _param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), dt)
        self.layers = stacked_blocks(config, rngs)
        self.norm = RMSNorm(config.d_model, config.rms_eps, dt, rngs=rngs)
        self.lm_head = (_param(rngs, (config.d_model, config.vocab_size), ("embed", "vocab"), dt)
                        if (lm_head and not config.tie_embeddings) else None)

    def hidden_states(self, tokens: Int[Array, "b t"], positions: Int[Array, "b t"] | None = None,
                      segment_ids: Int[Array, "b t"] | None = None, *, cache: KVCache | None = None,
                      token_mask: Bool[Array, "b t"] | None = None
                      ) -> tuple[Float[Array, "b t d"], KVCache | None]:
        """Final-norm hidden states `h[b, i]` (the state after reading tokens[b, :i+1]).

        Without a cache: attention is causal and restricted to equal `segment_ids` (packed rows);
        `positions` default to the index within the segment. With a cache: the `t` new tokens are
        written at slots `cache.end ...`, attend to every valid earlier slot, and `token_mask`
        marks which of them are real (left padding); `positions` are then required.
        """
        chex.assert_rank(tokens, 2)
        c = self.config
        b, t = tokens.shape
        if cache is None:
            if segment_ids is None:
                segment_ids = jnp.ones((b, t), jnp.int32)
            if positions is None:
                positions = positions_from_segments(segment_ids)
            index = jnp.arange(t, dtype=jnp.int32)
            mask = AttentionMask(query_slot=index, key_slot=index, query_segment=segment_ids,
                                 key_segment=segment_ids, key_valid=jnp.ones((b, t), bool), self_causal=True)
            end = None
        else:
            if positions is None:
                raise ValueError("Decoder.hidden_states: positions are required with a KV cache")
            if token_mask is None:
                token_mask = jnp.ones((b, t), bool)
            end = cache.end
            valid = jax.lax.dynamic_update_slice(cache.valid, token_mask, (jnp.zeros((), jnp.int32), end))
            mask = AttentionMask(query_slot=end + jnp.arange(t, dtype=jnp.int32),
                                 key_slot=jnp.arange(cache.length, dtype=jnp.int32),
                                 query_segment=jnp.zeros((b, t), jnp.int32),
                                 key_segment=jnp.zeros((b, cache.length), jnp.int32), key_valid=valid)
        chex.assert_equal_shape([tokens, positions])
        x = self.embed_tokens.get_value()[tokens].astype(c.compute_dtype)
        x = constrain(x, ("activation_batch", "activation_length", "activation_embed"))
        cos, sin = rotary_cos_sin(positions, c)
        cache_kv = None if cache is None else (cache.keys, cache.values)
        x, cache_kv = self._run_layers(x, cos, sin, mask, cache_kv, end)
        h = self.norm(x)
        if cache is None:
            return h, None
        return h, KVCache(keys=cache_kv[0], values=cache_kv[1], valid=valid, end=end + t)

    def _run_layers(self, x, cos, sin, mask, cache_kv, end):
        """The stacked blocks over `x`: a `lax.scan` over the layer axis, or the unrolled loop."""
        c = self.config
        graphdef, stacked = nnx.split(self.layers)

        def layer_fn(x, params, layer, cache_kv):
            return nnx.merge(graphdef, params)(x, cos, sin, mask, cache_kv, layer, end)

        if c.remat != "none" and cache_kv is None:
            layer_fn = jax.checkpoint(layer_fn, policy=REMAT_POLICIES[c.remat],
                                      prevent_cse=not c.scan_layers)
        if not c.scan_layers:
            for layer in range(c.n_layers):
                params = jax.tree.map(lambda a, i=layer: a[i], stacked)
                x, cache_kv = layer_fn(x, params, layer, cache_kv)
            return x, cache_kv

        def body(carry, xs):
            x, cache_kv = carry
            params, layer = xs
            return layer_fn(x, params, layer, cache_kv), None

        (x, cache_kv), _ = jax.lax.scan(body, (x, cache_kv),
                                        (stacked, jnp.arange(c.n_layers, dtype=jnp.int32)))
        return x, cache_kv

    def extend(self, tokens: Int[Array, "b t"], positions: Int[Array, "b t"], token_mask: Bool[Array, "b t"],
               keys: jax.Array, values: jax.Array, valid: Bool[Array, "b s"], write_at: Int[Array, "b"], *,
               span: jax.Array | None = None, block: int = 256, rows: Int[Array, "b"] | None = None
               ) -> tuple[Float[Array, "b t d"], jax.Array, jax.Array]:
        """Final-norm hidden states of `tokens` after a cache of rows at any lengths, whose new K/V
        it writes.

        `keys/values [n_layers, B, K, S, head_dim]` (head-major: each row's head is one contiguous
        `[S, head_dim]` matrix; token row i uses cache row `rows[i]`, or row i when `rows` is None,
        so a few rows of a large cache are read without copying it; a row `>= B` is padding),
        `valid [b, S]` the cached slots each token row may see; new token t of row b attends to them
        and to new tokens `j <= t` with `token_mask[b, j]` (one softmax over both). Only slots
        `< span` (a traced bound on every row's valid slots; default all) are read, `block` slots at
        a time with an online softmax, so the cost follows the rows' lengths, not S.

        Layer by layer the new tokens' K/V are first written at slots `write_at[i] .. +T-1` of their
        row (padding tokens too: they land beyond the row's end, hidden by `valid` until
        overwritten), then the layer is read (`valid` hides the slots just written). Writing before
        reading makes each in-place write follow the previous layer's read by data, so the cache is
        one buffer updated in place; with all writes after the layers, XLA could schedule them
        before the last layer's read and copied the whole cache twice per call (4 x 42 MB per decode
        step of 16 rows x 1,280 slots on the gym model: most of a step's time). Returns
        `(h [B, T, d], keys, values)`. The same numbers as `hidden_states` with a cache holding
        those slots, up to float rounding.
        """
        c = self.config
        t = tokens.shape[1]
        span = jnp.asarray(keys.shape[3] if span is None else span, jnp.int32)
        x = self.embed_tokens.get_value()[tokens].astype(c.compute_dtype)
        x = constrain(x, ("activation_batch", "activation_length", "activation_embed"))
        cos, sin = rotary_cos_sin(positions, c)
        causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        new_mask = causal[None] & token_mask[:, None, :]                       # [B, T(query), T(key)]
        graphdef, stacked = nnx.split(self.layers)

        def layer_fn(x, keys, values, params, layer):  # the whole cache goes in: blocks of it are read
            return nnx.merge(graphdef, params).extend(x, cos, sin, keys, values, valid, new_mask, span, block,
                                                      rows, write_at, layer)

        if not c.scan_layers:
            for layer in range(c.n_layers):
                params = jax.tree.map(lambda a, i=layer: a[i], stacked)
                x, keys, values = layer_fn(x, keys, values, params, layer)
            return self.norm(x), keys, values

        def body(carry, xs):
            params, layer = xs
            return layer_fn(*carry, params, layer), None

        (x, keys, values), _ = jax.lax.scan(body, (x, keys, values),
                                            (stacked, jnp.arange(c.n_layers, dtype=jnp.int32)))
        return self.norm(x), keys, values

    def output_matrix(self) -> Float[Array, "d v"]:
        """The `[d_model, vocab]` output projection (the transposed embedding when tied)."""
        if self.lm_head is None:
            if not self.config.tie_embeddings:
                raise ValueError("this Decoder was built with lm_head=False and has no output projection")
            return self.embed_tokens.get_value().T
        return self.lm_head.get_value()

    def project(self, hidden: Float[Array, "... d"]) -> Float[Array, "... v"]:
        """Logits in float32: `hidden @ W_out`."""
        w = self.output_matrix().astype(self.config.compute_dtype)
        return jnp.einsum("...d,dv->...v", hidden.astype(self.config.compute_dtype), w,
                          preferred_element_type=jnp.float32)

    def __call__(self, tokens: Int[Array, "b t"], positions: Int[Array, "b t"] | None = None,
                 segment_ids: Int[Array, "b t"] | None = None) -> Float[Array, "b t v"]:
        """Full logits `[B, T, vocab]` (float32). For long sequences use `token_logprobs`."""
        h, _ = self.hidden_states(tokens, positions, segment_ids)
        return self.project(h)

    def init_cache(self, batch: int, length: int) -> KVCache:
        return init_cache(self.config, batch, length)


def _chunked_over_positions(fn, hidden: jax.Array, targets: jax.Array, chunk_size: int):
    """Apply `fn(h [B, C, d], y [B, C]) -> tuple of [B, C]` over position chunks with `lax.map`.

    Each chunk is rematerialised in the backward pass, so at most `[B, C, vocab]` logits exist at once.
    """
    b, n, d = hidden.shape
    chunk = max(1, min(chunk_size, n))
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    h_chunks = hidden.reshape(b, n_chunks, chunk, d).swapaxes(0, 1)
    y_chunks = targets.reshape(b, n_chunks, chunk).swapaxes(0, 1)
    outs = jax.lax.map(jax.checkpoint(lambda hy: fn(*hy)), (h_chunks, y_chunks))
    return tuple(o.swapaxes(0, 1).reshape(b, n_chunks * chunk)[:, :n] for o in outs)


def logprobs_from_hidden(model: Decoder, hidden: Float[Array, "b l d"], tokens: Int[Array, "b l"],
                         *, chunk_size: int = 1024, with_entropy: bool = False,
                         temperature: float = 1.0
                         ) -> tuple[Float[Array, "b l"], Float[Array, "b l"] | None]:
    """`logp[b, i] = log softmax(h[b, i-1] W / T)[tokens[b, i]]` for i >= 1, and 0 at i = 0.

    Entropy (if asked) at i is that of the distribution which predicted token i (0 at i = 0).
    """
    chex.assert_rank(tokens, 2)

    def chunk_fn(h, y):
        logits = model.project(h) / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
        logp = picked - lse
        if with_entropy:
            probs = jax.nn.softmax(logits, axis=-1)
            ent = lse - jnp.sum(probs * logits, axis=-1)
            return logp, ent
        return (logp,)

    # Position j predicts tokens[j + 1]; all L positions are kept (the last one predicts a dummy)
    # so that a length axis sharded over `context` stays evenly divisible; the shift is done last.
    targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    outs = _chunked_over_positions(chunk_fn, hidden, targets, chunk_size)
    zero = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    logp = jnp.concatenate([zero, outs[0][:, :-1]], axis=1)
    entropy = jnp.concatenate([zero, outs[1][:, :-1]], axis=1) if with_entropy else None
    return logp, entropy


def token_logprobs(model: Decoder, tokens: Int[Array, "b l"], positions: Int[Array, "b l"] | None = None,
                   segment_ids: Int[Array, "b l"] | None = None, *, chunk_size: int = 1024,
                   with_entropy: bool = False, temperature: float = 1.0
                   ) -> tuple[Float[Array, "b l"], Float[Array, "b l"] | None]:
    """Log-probabilities `log π(tokens[i] | tokens[<i])` of given tokens, `[B, L]` float32.

    The hidden states are computed once; the `[L, vocab]` logits only ever exist `chunk_size`
    positions at a time (forward and backward). Position 0 (no prediction) gets 0; so does the
    first token of every packed segment, whose "previous" token belongs to another episode.
    Returns `(logp, entropy or None)`.
    """
    hidden, _ = model.hidden_states(tokens, positions, segment_ids)
    logp, entropy = logprobs_from_hidden(model, hidden, tokens, chunk_size=chunk_size,
                                         with_entropy=with_entropy, temperature=temperature)
    if segment_ids is not None:
        first = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                                 segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
        logp = jnp.where(first, 0.0, logp)
        if entropy is not None:
            entropy = jnp.where(first, 0.0, entropy)
    return logp, entropy
