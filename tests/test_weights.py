"""Hugging Face Qwen3 safetensors: round trips, and the loaded model equals a NumPy reference of the
HF Qwen3 forward pass written directly from HF-named tensors (catches transposes and RoPE layout)."""

import json

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
from tr.models.decoder import Decoder
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


def _reference_qwen3_logits(w, tokens, c):
    """HF Qwen3 forward for one sequence, NumPy float64, straight from the HF module definitions."""
    def rms(x, weight):
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_eps)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)

    n, hd, groups = len(tokens), c.head_dim, c.n_heads // c.n_kv_heads
    w = {k: v.astype(np.float64) for k, v in w.items()}
    inv_freq = 1.0 / c.rope_theta ** (np.arange(0, hd, 2) / hd)
    freqs = np.outer(np.arange(n), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
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
    for name in ("qwen3-0.6b", "qwen3-27b"):
        c = get_model_config(name)
        back = config_from_hf(hf_config_dict(c), name=name, remat=c.remat)
        assert back == c
    with pytest.raises(ValueError, match="lacks \\['hidden_size'\\]"):
        config_from_hf({"vocab_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 1})
