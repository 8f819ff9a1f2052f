"""Decoder, critic and chunked log-probs: checked against direct references written the obvious way."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tr.models.config import MODEL_NAMES, get_model_config
from tr.models.critic import CriticModel, critic_from_actor
from tr.models.decoder import REMAT_POLICIES, Decoder, positions_from_segments, token_logprobs

CFG = get_model_config("tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)

# Jitted entry points (eager NNX dispatch is slow on CPU).
forward = nnx.jit(lambda m, t: m(t))
forward_seg = nnx.jit(lambda m, t, s: m(t, segment_ids=s))
hidden_of = nnx.jit(lambda m, t: m.hidden_states(t)[0])
logprobs_of = nnx.jit(token_logprobs, static_argnames=("chunk_size", "with_entropy", "temperature"))
values_of = nnx.jit(lambda c, t: c(t))
values_seg = nnx.jit(lambda c, t, s: c(t, segment_ids=s))
cache_step = nnx.jit(lambda m, t, p, cache, mask: m.hidden_states(t, p, cache=cache, token_mask=mask))


@pytest.fixture(scope="module")
def model():
    return Decoder(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def untied_model():
    return Decoder(get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1,
                                    head_dim=16, d_ff=64, tie_embeddings=False), rngs=nnx.Rngs(3))


def _tokens(seed, b, l, vocab=CFG.vocab_size):
    return jax.random.randint(jax.random.key(seed), (b, l), 0, vocab, dtype=jnp.int32)


def _reference_logprobs(logits, tokens):
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
    out = np.zeros(tokens.shape, np.float32)
    for b in range(tokens.shape[0]):
        for i in range(1, tokens.shape[1]):
            out[b, i] = logp[b, i - 1, int(tokens[b, i])]
    return out


def test_named_sizes_match_published_parameter_counts():
    assert set(MODEL_NAMES) >= {"tiny", "small", "qwen3-0.6b", "qwen3-27b"}
    assert 2e6 < get_model_config("tiny").param_count() < 6e6
    assert 80e6 < get_model_config("small").param_count() < 120e6
    # Qwen3-0.6B: 596M with tied embeddings; Qwen3-8B: 8.19B (published model cards).
    assert abs(get_model_config("qwen3-0.6b").param_count() - 596_049_920) < 1e6
    assert abs(get_model_config("qwen3-8b").param_count() - 8.19e9) < 0.01e9
    assert 26e9 < get_model_config("qwen3-27b").param_count() < 28e9
    assert get_model_config("qwen3-27b").max_seq_len == 262_144


def test_param_count_formula_matches_the_module(model):
    n = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == CFG.param_count()


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        get_model_config("huge")
    with pytest.raises(ValueError, match="n_layer"):
        get_model_config("tiny", n_layer=3)
    with pytest.raises(ValueError, match="n_kv_heads"):
        get_model_config("tiny", n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        get_model_config("tiny", dtype="float8")
    with pytest.raises(ValueError, match="remat=True.*'full'"):
        get_model_config("tiny", remat=True)
    with pytest.raises(ValueError, match="rope_scaling='linear'"):
        get_model_config("tiny", rope_scaling="linear")


def test_every_parameter_has_logical_axes_of_its_rank(model):
    critic = CriticModel(CFG, rngs=nnx.Rngs(1))
    for module in (model, critic):
        for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
            axes = var.get_metadata().get("logical_axes")
            assert axes is not None, path
            assert len(axes) == var.get_value().ndim, (path, axes)


def test_chunked_logprobs_equal_full_softmax(model, untied_model):
    for m in (model, untied_model):
        tokens = _tokens(1, 2, 23)
        ref = _reference_logprobs(forward(m, tokens), np.asarray(tokens))
        for chunk in (1, 5, 1024):
            logp, _ = logprobs_of(m, tokens, chunk_size=chunk)
            np.testing.assert_allclose(np.asarray(logp), ref, atol=2e-5)


def test_entropy_matches_reference(model):
    tokens = _tokens(2, 2, 12)
    logits = forward(model, tokens)
    p = jax.nn.softmax(logits, -1)
    ref = -jnp.sum(p * jax.nn.log_softmax(logits, -1), -1)
    _, ent = logprobs_of(model, tokens, chunk_size=4, with_entropy=True)
    np.testing.assert_allclose(np.asarray(ent[:, 1:]), np.asarray(ref[:, :-1]), atol=2e-5)
    assert np.all(np.asarray(ent[:, 0]) == 0)


def test_chunked_logprob_gradient_equals_unchunked(model):
    tokens = _tokens(3, 2, 16)
    graphdef, params = nnx.split(model)

    def loss(p, chunk):
        m = nnx.merge(graphdef, p)
        logp, _ = logprobs_of(m, tokens, chunk_size=chunk)
        return logp.sum()

    def loss_ref(p):
        m = nnx.merge(graphdef, p)
        logits = m(tokens)
        lp = jax.nn.log_softmax(logits[:, :-1], -1)
        return jnp.take_along_axis(lp, tokens[:, 1:, None], -1).sum()

    g_ref = jax.jit(jax.grad(loss_ref))(params)
    g = jax.jit(jax.grad(loss), static_argnums=1)(params, 4)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def _max_positions_with_vocab_axis(jaxpr, vocab):
    """Largest prod(shape[:-1]) over intermediates whose last axis is the vocabulary (sub-jaxprs too)."""
    biggest = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            shape = getattr(v.aval, "shape", ())
            if len(shape) >= 2 and shape[-1] == vocab:
                biggest = max(biggest, int(np.prod(shape[:-1])))
        for param in eqn.params.values():
            subs = param if isinstance(param, (list, tuple)) else [param]
            for sub in subs:
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    biggest = max(biggest, _max_positions_with_vocab_axis(getattr(inner, "jaxpr", inner), vocab))
    return biggest


def test_chunked_logprobs_never_build_full_length_logits(model):
    """Forward and backward: no [B, L-1, vocab] intermediate (only [B, chunk, vocab]); unchunked has one."""
    b, l, chunk = 1, 128, 8
    tokens = _tokens(4, b, l)
    graphdef, params = nnx.split(model)

    def loss(p, chunk_size):
        logp, _ = token_logprobs(nnx.merge(graphdef, p), tokens, chunk_size=chunk_size)
        return logp.sum()

    chunked = jax.make_jaxpr(jax.grad(lambda p: loss(p, chunk)))(params)
    unchunked = jax.make_jaxpr(jax.grad(lambda p: loss(p, l)))(params)
    assert _max_positions_with_vocab_axis(unchunked.jaxpr, CFG.vocab_size) >= b * (l - 1)
    assert _max_positions_with_vocab_axis(chunked.jaxpr, CFG.vocab_size) == max(b * chunk, CFG.d_model)


def test_attention_is_causal(model):
    tokens = _tokens(5, 1, 10)
    changed = tokens.at[0, 6].set((tokens[0, 6] + 1) % CFG.vocab_size)
    a, b = forward(model, tokens), forward(model, changed)
    np.testing.assert_allclose(np.asarray(a[0, :6]), np.asarray(b[0, :6]), atol=1e-6)
    assert np.abs(np.asarray(a[0, 6:] - b[0, 6:])).max() > 1e-4


def test_packed_segments_equal_separate_sequences(model):
    x, y = _tokens(6, 1, 7), _tokens(7, 1, 5)
    packed = jnp.concatenate([x, y], axis=1)
    segments = jnp.array([[1] * 7 + [2] * 5], jnp.int32)
    np.testing.assert_array_equal(np.asarray(positions_from_segments(segments))[0],
                                  list(range(7)) + list(range(5)))
    out = forward_seg(model, packed, segments)
    np.testing.assert_allclose(np.asarray(out[:, :7]), np.asarray(forward(model, x)), atol=2e-5)
    np.testing.assert_allclose(np.asarray(out[:, 7:]), np.asarray(forward(model, y)), atol=2e-5)
    logp, _ = logprobs_of(model, packed, None, segments, chunk_size=4)
    assert float(logp[0, 7]) == 0.0  # first token of the second episode: no prediction
    ref_y, _ = logprobs_of(model, y)
    np.testing.assert_allclose(np.asarray(logp[:, 8:]), np.asarray(ref_y[:, 1:]), atol=2e-5)


def test_kv_cache_decoding_equals_full_forward(model):
    """Left-padded prefill then one token at a time through the cache reproduces the full logits."""
    lengths = [3, 6]
    seqs = [_tokens(10 + i, 1, 9)[0] for i in range(2)]
    prompt_len, total = max(lengths), 9 + 3
    prompt = np.zeros((2, prompt_len), np.int32)
    pmask = np.zeros((2, prompt_len), bool)
    pos = np.zeros((2, prompt_len), np.int32)
    for r, n in enumerate(lengths):
        prompt[r, prompt_len - n:] = np.asarray(seqs[r][:n])
        pmask[r, prompt_len - n:] = True
        pos[r, prompt_len - n:] = np.arange(n)
    cache = model.init_cache(2, total)
    h, cache = cache_step(model, jnp.asarray(prompt), jnp.asarray(pos), cache, jnp.asarray(pmask))
    step_logits = [model.project(h[:, -1])]
    for t in range(3):
        nxt = jnp.asarray([[int(seqs[r][lengths[r] + t])] for r in range(2)], jnp.int32)
        p = jnp.asarray([[lengths[r] + t] for r in range(2)], jnp.int32)
        h, cache = cache_step(model, nxt, p, cache, jnp.ones((2, 1), bool))
        step_logits.append(model.project(h[:, -1]))
    for r, n in enumerate(lengths):
        full = forward(model, seqs[r][None, : n + 3])
        for t in range(4):
            np.testing.assert_allclose(np.asarray(step_logits[t][r]), np.asarray(full[0, n - 1 + t]),
                                       atol=5e-5)


def test_logprobs_at_a_temperature(model):
    tokens = _tokens(8, 1, 6)
    logp, _ = logprobs_of(model, tokens, temperature=0.5)
    ref = jax.nn.log_softmax(forward(model, tokens) / 0.5, -1)
    np.testing.assert_allclose(np.asarray(logp[0, 1:]),
                               np.asarray(jnp.take_along_axis(ref[0, :-1], tokens[0, 1:, None], -1)[:, 0]),
                               atol=2e-5)


@pytest.fixture(scope="module")
def critic():
    c = CriticModel(CFG, rngs=nnx.Rngs(1))
    # Non-zero head so that values depend on the hidden states.
    c.value_head.set_value(jax.random.normal(jax.random.key(9), (CFG.d_model,)))
    c.value_bias.set_value(jnp.float32(0.25))
    c.value_start.set_value(jnp.float32(-1.5))
    return c


def test_critic_values_are_pre_token(critic):
    """Changing token i leaves v_0..v_i unchanged and changes v_{i+1}."""
    tokens = _tokens(11, 1, 10)
    v = np.asarray(values_of(critic, tokens))
    assert v.shape == (1, 10) and v.dtype == np.float32
    assert v[0, 0] == pytest.approx(-1.5)
    for i in (0, 4, 8):
        changed = tokens.at[0, i].set((tokens[0, i] + 7) % CFG.vocab_size)
        w = np.asarray(values_of(critic, changed))
        np.testing.assert_allclose(w[0, : i + 1], v[0, : i + 1], atol=1e-6)
        assert abs(w[0, i + 1] - v[0, i + 1]) > 1e-5


def test_critic_value_is_head_of_previous_hidden_state(critic):
    tokens = _tokens(12, 2, 8)
    h = hidden_of(critic.backbone, tokens)
    post = np.asarray(h) @ np.asarray(critic.value_head.get_value()) + 0.25
    v = np.asarray(values_of(critic, tokens))
    np.testing.assert_allclose(v[:, 1:], post[:, :-1], atol=1e-5)


def test_critic_restarts_at_packed_segment_boundaries(critic):
    x, y = _tokens(13, 1, 5), _tokens(14, 1, 4)
    packed = jnp.concatenate([x, y], 1)
    seg = jnp.array([[1] * 5 + [2] * 4], jnp.int32)
    v = np.asarray(values_seg(critic, packed, seg))
    np.testing.assert_allclose(v[0, 5:], np.asarray(values_of(critic, y))[0], atol=2e-5)
    assert v[0, 5] == pytest.approx(-1.5)


def test_critic_from_actor_copies_the_backbone(model):
    critic = critic_from_actor(model, rngs=nnx.Rngs(5))
    h_actor = hidden_of(model, _tokens(15, 1, 6))
    h_critic = hidden_of(critic.backbone, _tokens(15, 1, 6))
    np.testing.assert_array_equal(np.asarray(h_actor), np.asarray(h_critic))
    assert critic.backbone.lm_head is None


def _variant(**fields):
    """CFG with `fields` changed, built with the same seed as `model` (same parameters)."""
    return Decoder(dataclasses.replace(CFG, **fields), rngs=nnx.Rngs(0))


def _logprob_grads(m, tokens):
    graphdef, params = nnx.split(m)
    loss = lambda p: logprobs_of(nnx.merge(graphdef, p), tokens, chunk_size=4)[0].sum()  # noqa: E731
    return jax.jit(jax.grad(loss))(params)


def test_layers_are_stacked_with_a_leading_layer_axis(model):
    gate = model.layers.mlp.gate_proj
    assert gate.get_value().shape == (CFG.n_layers, CFG.d_model, CFG.d_ff)
    assert gate.get_metadata()["logical_axes"] == ("layers", "embed", "mlp")
    # Each layer got its own random draw (nnx.vmap over split RNG streams).
    assert not np.allclose(np.asarray(gate.get_value()[0]), np.asarray(gate.get_value()[1]))


def test_scan_over_layers_equals_the_unrolled_loop(model):
    """Same stacked parameters: forward logits, gradients and cached decoding agree."""
    loop = _variant(scan_layers=False)
    tokens = _tokens(18, 2, 12)
    np.testing.assert_allclose(np.asarray(forward(model, tokens)), np.asarray(forward(loop, tokens)),
                               atol=1e-5, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(_logprob_grads(model, tokens)), jax.tree.leaves(_logprob_grads(loop, tokens))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    mask = jnp.ones((2, 12), bool)
    positions = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
    h_scan, c_scan = cache_step(model, tokens, positions, model.init_cache(2, 16), mask)
    h_loop, c_loop = cache_step(loop, tokens, positions, loop.init_cache(2, 16), mask)
    np.testing.assert_allclose(np.asarray(h_scan), np.asarray(h_loop), atol=1e-5, rtol=1e-5)
    assert c_scan.keys.shape == (CFG.n_layers, 2, 16, CFG.n_kv_heads, CFG.head_dim)
    np.testing.assert_allclose(np.asarray(c_scan.keys), np.asarray(c_loop.keys), atol=1e-5, rtol=1e-5)
    assert int(c_scan.end) == 12 and bool(c_scan.valid[:, :12].all()) and not bool(c_scan.valid[:, 12:].any())


@pytest.mark.parametrize("remat", ["none", "full"])
def test_query_chunked_attention_equals_all_at_once(model, remat):
    """attention_chunk: the same logits and gradients, packed segments included; the causal blocks
    kept for the backward (no remat) or recomputed in it."""
    chunked = _variant(attention_chunk=4, remat=remat)
    tokens = _tokens(20, 2, 12)
    segments = jnp.array([[1] * 5 + [2] * 7, [3] * 12], jnp.int32)
    np.testing.assert_allclose(np.asarray(forward_seg(chunked, tokens, segments)),
                               np.asarray(forward_seg(model, tokens, segments)), atol=1e-5, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(_logprob_grads(model, tokens)), jax.tree.leaves(_logprob_grads(chunked, tokens))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", [p for p in REMAT_POLICIES if p != "none"])
def test_every_remat_policy_gives_the_same_gradients(model, policy):
    tokens = _tokens(16, 2, 12)
    for a, b in zip(jax.tree.leaves(_logprob_grads(model, tokens)),
                    jax.tree.leaves(_logprob_grads(_variant(remat=policy), tokens))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_full_remat_saves_no_mlp_activation(capsys):
    """Under 'full' the backward keeps no [L, B, T, d_ff] MLP activation; under 'none' it does."""
    tokens = _tokens(19, 1, 8)

    def saved(m):
        graphdef, params = nnx.split(m)
        jax.ad_checkpoint.print_saved_residuals(lambda p: nnx.merge(graphdef, p)(tokens).sum(), params)
        return capsys.readouterr().out

    mlp_act = f"f32[{CFG.n_layers},1,8,{CFG.d_ff}]"
    assert mlp_act in saved(_variant(remat="none"))
    assert mlp_act not in saved(_variant(remat="full"))


def test_bfloat16_model_tracks_float32(model):
    bf16 = Decoder(get_model_config("tiny", **{**{f: getattr(CFG, f) for f in (
        "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff")}, "dtype": "bfloat16",
        "param_dtype": "bfloat16"}), rngs=nnx.Rngs(0))
    tokens = _tokens(17, 2, 16)
    lp16, _ = logprobs_of(bf16, tokens, chunk_size=8)
    lp32, _ = logprobs_of(model, tokens, chunk_size=8)
    assert lp16.dtype == jnp.float32
    assert bf16.embed_tokens.get_value().dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(lp16), np.asarray(lp32), atol=0.1)  # same init, bf16 rounding only
