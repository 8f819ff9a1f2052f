"""Model configurations: one frozen dataclass, named sizes from a CPU-tiny model to the paper's 27B.

`get_model_config(name, **overrides)` is the only way the rest of `tr` obtains a config, so a size
is referred to by name everywhere (experiment files, checkpoints, benchmarks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT_NAMES: tuple[str, ...] = ("none", "full", "minimal", "save_qkv_proj", "save_attention_out")
ROPE_SCALINGS: tuple[str, ...] = ("none", "yarn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen3-style decoder dimensions.

    `dtype` is the compute dtype of activations, `param_dtype` the storage dtype of parameters;
    norms, softmax, log-probs and values are always computed in float32.
    `remat` names what each block keeps for the backward pass (`REMAT_NAMES`; `decoder.REMAT_POLICIES`
    maps them to `jax.checkpoint` policies): 'none' keeps every activation, 'full' recomputes the
    whole block from its input, 'minimal' keeps the weight matmuls' outputs, 'save_qkv_proj' /
    'save_attention_out' keep the named projections.
    `attention_chunk` > 0 computes attention that many queries at a time (at most
    `[B, H, attention_chunk, S]` scores at once; exact); 0 all queries together.
    `scan_layers` runs the stacked blocks with `lax.scan` (compile time independent of depth);
    False unrolls them in a Python loop (same parameters, same numbers; the reference form).
    RoPE: `rope_scaling='yarn'` scales the frequencies by `rope_factor` from the pre-training length
    `rope_original_max_len` (0: `max_seq_len`) with `rope_beta_fast/slow` and multiplies cos/sin by
    `rope_attention_factor` (0: `0.1 ln(rope_factor) + 1`); see `decoder.rope_frequencies`.
    """

    name: str = "custom"
    vocab_size: int = 512
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    d_ff: int = 768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = True
    max_seq_len: int = 4096
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    scan_layers: bool = True
    attention_chunk: int = 0
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_original_max_len: int = 0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float = 0.0
    rope_truncate: bool = True

    def __post_init__(self) -> None:
        positive = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                    "d_ff", "max_seq_len")
        for field in positive:
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig({self.name!r}).{field} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig({self.name!r}): n_heads={self.n_heads} must be a multiple of "
                f"n_kv_heads={self.n_kv_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig({self.name!r}).head_dim={self.head_dim} must be even (rotary pairs)")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(f"ModelConfig({self.name!r}).{field}={getattr(self, field)!r}; "
                                 f"expected one of {sorted(_DTYPES)}")
        if self.rms_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(f"ModelConfig({self.name!r}): rms_eps and rope_theta must be > 0")
        if not isinstance(self.attention_chunk, int) or self.attention_chunk < 0:
            raise ValueError(f"ModelConfig({self.name!r}).attention_chunk={self.attention_chunk!r} must be an int >= 0")
        if not isinstance(self.remat, str) or self.remat not in REMAT_NAMES:
            raise ValueError(f"ModelConfig({self.name!r}).remat={self.remat!r}; expected one of "
                             f"{REMAT_NAMES} (a policy name, not a bool: True is now 'full')")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"ModelConfig({self.name!r}).rope_scaling={self.rope_scaling!r}; "
                             f"supported: {ROPE_SCALINGS}")
        if self.rope_factor <= 0 or self.rope_original_max_len < 0 or self.rope_attention_factor < 0:
            raise ValueError(f"ModelConfig({self.name!r}): rope_factor must be > 0, "
                             "rope_original_max_len and rope_attention_factor >= 0")

    @property
    def compute_dtype(self) -> Any:
        return _DTYPES[self.dtype]

    @property
    def weight_dtype(self) -> Any:
        return _DTYPES[self.param_dtype]

    @property
    def n_groups(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    def param_count(self, *, with_lm_head: bool = True) -> int:
        """Exact parameter count of `Decoder(self)` (formula; no allocation)."""
        d, hd = self.d_model, self.head_dim
        attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2 + 2 * hd
        mlp = 3 * d * self.d_ff
        block = attn + mlp + 2 * d
        head = 0 if (self.tie_embeddings or not with_lm_head) else self.vocab_size * d
        return self.vocab_size * d + self.n_layers * block + d + head


# Real Qwen3 dimensions (config.json of the Qwen/Qwen3-* releases). The paper's backbone
# ("Qwen3.8-27B", 262,144-token context) has no public config: 'qwen3-27b' is a dense Qwen3-family
# model of that size (64 layers, d_model 5120, 40 query / 8 kv heads, d_ff 21504: 26.7B parameters).
_NAMED: dict[str, dict[str, Any]] = {
    # CPU tests and the embedded default: byte tokenizer (256 bytes + specials) in a 512 vocab, ~3.3M params.
    "tiny": dict(vocab_size=512, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64,
                 d_ff=768, max_seq_len=4096),
    # The gym's embedded default (tr/models/embedded.py): the tiny shape at half width, a 1,024-id
    # BPE vocabulary trained on gym text, ~0.9M parameters; layers unrolled (on CPU its SFT step
    # compiles 2.5x and runs ~1.8x faster than the scanned form); attention in blocks of 128
    # queries (8 x 1,024-token rows on 2 cores: an SFT step 3.7 -> 2.1 s, a PPO step 8.4 -> 4.5 s).
    "gym": dict(vocab_size=1024, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32,
                d_ff=384, max_seq_len=1024, scan_layers=False, attention_chunk=128),
    # ~97M parameters: checkpoint and throughput benchmarks.
    "small": dict(vocab_size=512, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, head_dim=64,
                  d_ff=2816, max_seq_len=4096),
    "qwen3-0.6b": dict(vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
                       head_dim=128, d_ff=3072, tie_embeddings=True, max_seq_len=40960,
                       dtype="bfloat16", param_dtype="bfloat16"),
    "qwen3-1.7b": dict(vocab_size=151936, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8,
                       head_dim=128, d_ff=6144, tie_embeddings=True, max_seq_len=40960,
                       dtype="bfloat16", param_dtype="bfloat16"),
    "qwen3-4b": dict(vocab_size=151936, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8,
                     head_dim=128, d_ff=9728, tie_embeddings=True, max_seq_len=40960,
                     dtype="bfloat16", param_dtype="bfloat16"),
    "qwen3-8b": dict(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
                     head_dim=128, d_ff=12288, tie_embeddings=False, max_seq_len=40960,
                     dtype="bfloat16", param_dtype="bfloat16"),
    "qwen3-14b": dict(vocab_size=151936, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8,
                      head_dim=128, d_ff=17408, tie_embeddings=False, max_seq_len=40960,
                      dtype="bfloat16", param_dtype="bfloat16"),
    "qwen3-27b": dict(vocab_size=151936, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8,
                      head_dim=128, d_ff=21504, tie_embeddings=False, max_seq_len=262144,
                      dtype="bfloat16", param_dtype="bfloat16", remat="full"),
    "qwen3-32b": dict(vocab_size=151936, d_model=5120, n_layers=64, n_heads=64, n_kv_heads=8,
                      head_dim=128, d_ff=25600, tie_embeddings=False, max_seq_len=40960,
                      dtype="bfloat16", param_dtype="bfloat16", remat="full"),
}
# The same backbone with a 32,768-token context: Terminal-RSI's paper setting summarises an episode
# at 32,768 tokens, and the stages' episode sampler caches the model's whole context per row (8 GiB
# a row here, 64 GiB at 262,144). Same parameters and RoPE: only the longest position differs.
_NAMED["qwen3-27b-32k"] = {**_NAMED["qwen3-27b"], "max_seq_len": 32768}

MODEL_NAMES: tuple[str, ...] = tuple(_NAMED)


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """The named size `name` with `overrides` applied (e.g. `get_model_config('tiny', n_layers=2)`)."""
    if name not in _NAMED:
        raise ValueError(f"unknown model size {name!r}; known sizes: {', '.join(MODEL_NAMES)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"get_model_config({name!r}): unknown override field(s) {unknown}; "
                         f"valid fields: {sorted(fields)}")
    return ModelConfig(name=name, **{**_NAMED[name], **overrides})
