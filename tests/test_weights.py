"""Hugging Face Qwen3 safetensors: round trips, and the loaded model equals a NumPy reference of the
HF Qwen3 forward pass written directly from HF-named tensors (catches transposes and RoPE layout)."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder, rope_frequencies
from tr.models.weights import (config_from_hf, export_state_dict, hf_config_dict, import_state_dict,
                               load_safetensors, save_safetensors)

CFG = get_model_config("tiny", n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                       vocab_size=300, tie_embeddings=False, rope_theta=10_000.0)
forward = nnx.jit(lambda m, t: m(t))


def _params(module):
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def _random_hf_tensors(c, seed=0):
    rng = np.random.default_rng(seed)
    d, hd = c.d_model, c.head_dim
    t = {"model.embed_tokens.weight": rng.normal(size=(c.vocab_size, d)),
         "model.norm.weight": 1 + 0.1 * rng.normal(size=d),
         "lm_head.weight": rng.normal(size=(c.vocab_size, d)) * 0.1}
    for i in range(c.n_layers):
        h = f"model.layers.{i}."
        t.update({
            h + "input_layernorm.weight": 1 + 0.1 * rng.normal(size=d),
            h + "post_attention_layernorm.weight": 1 + 0.1 * rng.normal(size=d),
            h + "self_attn.q_proj.weight": rng.normal(size=(c.n_heads * hd, d)) * 0.2,
            h + "self_attn.k_proj.weight": rng.normal(size=(c.n_kv_heads * hd, d)) * 0.2,
            h + "self_attn.v_proj.weight": rng.normal(size=(c.n_kv_heads * hd, d)) * 0.2,
            h + "self_attn.o_proj.weight": rng.normal(size=(d, c.n_heads * hd)) * 0.2,
            h + "self_attn.q_norm.weight": 1 + 0.3 * rng.normal(size=hd),
            h + "self_attn.k_norm.weight": 1 + 0.3 * rng.normal(size=hd),
            h + "mlp.gate_proj.weight": rng.normal(size=(c.d_ff, d)) * 0.2,
            h + "mlp.up_proj.weight": rng.normal(size=(c.d_ff, d)) * 0.2,
            h + "mlp.down_proj.weight": rng.normal(size=(d, c.d_ff)) * 0.2,
        })
    return {k: v.astype(np.float32) for k, v in t.items()}


def _reference_yarn(head_dim, theta, factor, original, beta_fast=32.0, beta_slow=1.0):
    """YaRN inverse frequencies and cos/sin scale, one dimension at a time (Peng et al. 2023, §3.2-3.4):
    a dimension that turns more than beta_fast times over the original context keeps its frequency,
    one that turns fewer than beta_slow times is interpolated (divided by the scale), linear between."""
    half = head_dim // 2
    wavelength_turns = lambda r: head_dim * math.log(original / (r * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
    low, high = max(math.floor(wavelength_turns(beta_fast)), 0), min(math.ceil(wavelength_turns(beta_slow)), head_dim - 1)
    out = []
    for i in range(half):
        base = theta ** (-2.0 * i / head_dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(base * (1 - ramp) + (base / factor) * ramp)
    return np.array(out), 0.1 * math.log(factor) + 1.0


def _reference_qwen3_logits(w, tokens, c, yarn=None, offset=0):
    """HF Qwen3 forward for one sequence, NumPy float64, straight from the HF module definitions."""
    def rms(x, weight):
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_eps)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)

    n, hd, groups = len(tokens), c.head_dim, c.n_heads // c.n_kv_heads
    w = {k: v.astype(np.float64) for k, v in w.items()}
    inv_freq, scale = (1.0 / c.rope_theta ** (np.arange(0, hd, 2) / hd), 1.0) if yarn is None else yarn
    freqs = np.outer(offset + np.arange(n), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = scale * np.cos(emb)[:, None, :], scale * np.sin(emb)[:, None, :]
    x = w["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((n, n), bool))
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, c.n_heads, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, c.n_kv_heads, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, c.n_kv_heads, hd)
        q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)  # repeat_kv
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, c.n_heads * hd)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if c.tie_embeddings else w["lm_head.weight"]
    return x @ head.T


@pytest.mark.parametrize("tied", [False, True])
def test_loaded_hf_weights_reproduce_reference_qwen3_forward(tmp_path, tied):
    c = get_model_config("tiny", **{**{k: getattr(CFG, k) for k in ("n_layers", "d_model", "n_heads", "n_kv_heads",
                                                                    "head_dim", "d_ff", "vocab_size", "rope_theta")},
                                    "tie_embeddings": tied})
    tensors = _random_hf_tensors(c)
    if tied:
        tensors.pop("lm_head.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_safetensors(Decoder(c, rngs=nnx.Rngs(1)), tmp_path)
    tokens = np.random.default_rng(1).integers(0, c.vocab_size, size=13)
    ours = np.asarray(forward(model, jnp.asarray(tokens[None], jnp.int32)))[0]
    np.testing.assert_allclose(ours, _reference_qwen3_logits(tensors, tokens, c), atol=2e-4, rtol=1e-4)


def test_export_import_round_trip_is_exact_with_shards(tmp_path):
    model = Decoder(CFG, rngs=nnx.Rngs(0))
    files = save_safetensors(model, tmp_path, max_shard_bytes=40_000)
    assert "model.safetensors.index.json" in files and len(files) > 3
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["model.layers.1.mlp.down_proj.weight"].startswith("model-")
    with safe_open(str(tmp_path / index["weight_map"]["model.layers.0.self_attn.q_proj.weight"]), "numpy") as f:
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert q.shape == (CFG.n_heads * CFG.head_dim, CFG.d_model) and q.dtype == np.float32
    loaded = load_safetensors(Decoder(CFG, rngs=nnx.Rngs(7)), tmp_path)
    a, b = _params(model), _params(loaded)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert config_from_hf(tmp_path, name=CFG.name) == CFG


def test_bfloat16_checkpoint_keeps_its_dtype(tmp_path):
    c = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                         param_dtype="bfloat16", dtype="bfloat16")
    model = Decoder(c, rngs=nnx.Rngs(0))
    save_safetensors(model, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "numpy") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == ml_dtypes.bfloat16
    loaded = load_safetensors(Decoder(c, rngs=nnx.Rngs(3)), tmp_path)
    for k, v in _params(loaded).items():
        assert v.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(v, _params(model)[k])
    f32 = export_state_dict(model, dtype="float32")
    assert f32["model.norm.weight"].dtype == np.float32


def test_critic_round_trip(tmp_path):
    critic = CriticModel(CFG, rngs=nnx.Rngs(0))
    critic.value_head.set_value(jnp.arange(CFG.d_model, dtype=jnp.float32))
    critic.value_start.set_value(jnp.float32(0.5))
    tensors = export_state_dict(critic)
    assert tensors["score.weight"].shape == (1, CFG.d_model) and "lm_head.weight" not in tensors
    loaded = import_state_dict(CriticModel(CFG, rngs=nnx.Rngs(9)), tensors)
    for k, v in _params(critic).items():
        np.testing.assert_array_equal(v, _params(loaded)[k])


def test_bad_checkpoints_name_the_tensor_and_file(tmp_path):
    tensors = _random_hf_tensors(CFG)
    model = Decoder(CFG, rngs=nnx.Rngs(0))
    broken = dict(tensors)
    broken.pop("model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="missing 1 tensor.*model.layers.1.mlp.up_proj.weight"):
        import_state_dict(model, broken)
    wrong = dict(tensors, **{"model.norm.weight": np.ones(7, np.float32)})
    save_file(wrong, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.safetensors.*'model.norm.weight' has shape \(7,\), expected \(48,\)"):
        load_safetensors(model, tmp_path)
    with pytest.raises(ValueError, match="unexpected tensor.*model.layers.2"):
        import_state_dict(model, dict(tensors, **{"model.layers.2.mlp.up_proj.weight": np.ones(1)}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_safetensors(model, tmp_path / "empty")


def test_hf_config_round_trip():
    yarn = get_model_config("qwen3-8b", rope_scaling="yarn", rope_factor=4.0, rope_original_max_len=32768,
                            max_seq_len=131072)
    for c in (get_model_config("qwen3-0.6b"), get_model_config("qwen3-27b"), yarn):
        back = config_from_hf(hf_config_dict(c), name=c.name, remat=c.remat)
        assert back == c
    with pytest.raises(ValueError, match="lacks \\['hidden_size'\\]"):
        config_from_hf({"vocab_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 1})


# A transformers >= 5 config.json (Qwen3 release layout): `dtype`, `rope_parameters`.
HF5 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 300, "hidden_size": 48,
       "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 16, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
       "dtype": "float32", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
       "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
       "layer_types": ["full_attention", "full_attention"], "attention_bias": False, "hidden_act": "silu"}


def test_config_from_hf_reads_both_generations():
    new = config_from_hf(HF5)
    assert new.param_dtype == new.dtype == "float32"   # not silently bfloat16
    assert new.rope_theta == 10000.0                    # not silently 1e6
    old = {k: v for k, v in HF5.items() if k not in ("dtype", "rope_parameters")}
    old.update(torch_dtype="float32", rope_theta=10000.0)
    assert config_from_hf(old) == new
    assert config_from_hf({**HF5, "dtype": "bfloat16"}).param_dtype == "bfloat16"
    with pytest.raises(ValueError, match="rope_theta=1000000.0 disagrees"):
        config_from_hf({**HF5, "rope_theta": 1e6})


def test_yarn_frequencies_follow_the_formula():
    c = get_model_config("qwen3-8b", rope_scaling="yarn", rope_factor=4.0, rope_original_max_len=32768,
                         max_seq_len=131072)
    inv_freq, scale = rope_frequencies(c)
    ref, ref_scale = _reference_yarn(c.head_dim, c.rope_theta, 4.0, 32768)
    np.testing.assert_allclose(inv_freq, ref, rtol=1e-6)
    assert scale == pytest.approx(ref_scale) == pytest.approx(1 + 0.1 * math.log(4.0))
    plain, _ = rope_frequencies(get_model_config("qwen3-8b"))
    assert inv_freq[0] == plain[0] and inv_freq[-1] == pytest.approx(plain[-1] / 4.0, rel=1e-6)
    assert np.all(inv_freq <= plain) and np.any((inv_freq < plain) & (inv_freq > plain / 4.0))
    # The Qwen3 long-context recipe (transformers 4.x `rope_scaling` and >= 5 `rope_parameters`).
    legacy = {**{k: v for k, v in HF5.items() if k != "rope_parameters"}, "rope_theta": 1e6,
              "max_position_embeddings": 131072,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    current = {**HF5, "max_position_embeddings": 131072,
               "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                   "original_max_position_embeddings": 32768}}
    a, b = config_from_hf(legacy), config_from_hf(current)
    assert a == b and (a.rope_scaling, a.rope_factor, a.rope_original_max_len) == ("yarn", 4.0, 32768)


def test_yarn_model_reproduces_the_reference_forward(tmp_path):
    """Long positions make the scaling matter: a 512-token original context scaled by 8."""
    c = get_model_config("tiny", **{**{k: getattr(CFG, k) for k in ("n_layers", "d_model", "n_heads", "n_kv_heads",
                                                                    "head_dim", "d_ff", "vocab_size", "rope_theta")},
                                    "tie_embeddings": False, "rope_scaling": "yarn", "rope_factor": 8.0,
                                    "rope_original_max_len": 512, "max_seq_len": 4096})
    tensors = _random_hf_tensors(c, seed=4)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_safetensors(Decoder(c, rngs=nnx.Rngs(1)), tmp_path)
    tokens = np.random.default_rng(2).integers(0, c.vocab_size, size=40)
    positions = jnp.asarray(3000 + np.arange(40)[None], jnp.int32)   # far past the original context
    forward_at = nnx.jit(lambda m, t, p: m(t, p))
    ours = np.asarray(forward_at(model, jnp.asarray(tokens[None], jnp.int32), positions))[0]
    reference = _reference_qwen3_logits(tensors, tokens, c, yarn=_reference_yarn(c.head_dim, c.rope_theta, 8.0, 512),
                                        offset=3000)
    np.testing.assert_allclose(ours, reference, atol=2e-4, rtol=1e-4)
    plain = np.asarray(forward_at(load_safetensors(Decoder(dataclasses.replace(c, rope_scaling="none"),
                                                           rngs=nnx.Rngs(1)), tmp_path),
                                  jnp.asarray(tokens[None], jnp.int32), positions))[0]
    assert np.abs(plain - ours).max() > 1e-2   # the scaling changes the logits


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window=true"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types \\['sliding_attention'\\]"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type 'linear'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"dtype": "float8_e4m3fn"}, "dtype 'float8_e4m3fn'"),
    ({"model_type": "qwen3_moe", "num_experts": 128}, "model_type 'qwen3_moe'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
])
def test_unsupported_features_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**HF5, **change})
