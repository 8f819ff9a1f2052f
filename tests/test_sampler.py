"""KV-cache sampler: behaviour log-probs equal the training forward, greedy equals a naive full-prefix
loop, nucleus sampling follows its distribution, stops and caps, and shape buckets avoid recompiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tr.models.chat import next_prompt, prompt_ids
from tr.models.config import get_model_config
from tr.models.decoder import Decoder, token_logprobs
from tr.models.tokenizer import ByteTokenizer
from tr.sampling.sampler import JaxSampler, SamplingParams, sample_token
from tr.sampling.vllm_engine import VllmEngine, VllmUnavailableError

CFG = get_model_config("tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)
TOK = ByteTokenizer()
logprobs_of = nnx.jit(token_logprobs, static_argnames=("chunk_size", "with_entropy", "temperature"))
forward = nnx.jit(lambda m, t: m(t))


@pytest.fixture(scope="module")
def model():
    return Decoder(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler(model):
    return JaxSampler(model, TOK, min_prompt_bucket=32, min_new_bucket=16)


PROMPTS = [TOK.encode("ls -la"), TOK.encode("cat /etc/hostname && echo done"), TOK.encode("x")]


def _processed_logprobs(logits: np.ndarray, tokens: list[int], temperature: float, top_p: float) -> np.ndarray:
    """Reference: log p(token) under softmax(logits / T) cut to the top-p nucleus, renormalised."""
    out = []
    for row, tok in zip(logits.astype(np.float64), tokens):
        p = np.exp(row / temperature - np.max(row / temperature))
        p /= p.sum()
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        keep = order[before < top_p]
        assert tok in keep
        out.append(np.log(p[tok] / p[keep].sum()))
    return np.asarray(out)


def test_logprobs_are_of_the_distribution_sampled_from(model, sampler):
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12, seed=3)
    outs = sampler.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.token_ids) == 12 and out.finish_reason == "length"
        full = jnp.asarray([list(prompt) + out.token_ids], jnp.int32)
        logp, _ = logprobs_of(model, full, chunk_size=8)
        np.testing.assert_allclose(out.raw_logprobs, np.asarray(logp[0, len(prompt):]), atol=1e-4)
        logits = np.asarray(forward(model, full)[0, len(prompt) - 1:-1])
        np.testing.assert_allclose(out.logprobs, _processed_logprobs(logits, out.token_ids, 0.8, 0.9), atol=1e-4)
        assert not np.allclose(out.logprobs, out.raw_logprobs, atol=1e-3)  # a different quantity at 0.8/0.9


def test_training_sampling_logprobs_are_the_raw_model_s(model, sampler):
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12, seed=4)
    for prompt, out in zip(PROMPTS, sampler.generate(PROMPTS, params)):
        assert out.logprobs == out.raw_logprobs  # the same numbers, not merely close
        full = jnp.asarray([list(prompt) + out.token_ids], jnp.int32)
        logp, _ = logprobs_of(model, full, chunk_size=8)
        np.testing.assert_allclose(out.logprobs, np.asarray(logp[0, len(prompt):]), atol=1e-4)


def test_greedy_equals_naive_full_prefix_loop(model, sampler):
    outs = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=6))
    for prompt, out in zip(PROMPTS, outs):
        seq = list(prompt)
        for _ in range(6):  # right-padded to one length (causal: padding after the prefix is never seen)
            padded = np.zeros((1, 64), np.int32)
            padded[0, : len(seq)] = seq
            logits = forward(model, jnp.asarray(padded))
            seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
        assert out.token_ids == seq[len(prompt):]
        assert out.sampling_logprobs == [0.0] * 6


def test_nucleus_sampling_matches_its_distribution():
    logits = jnp.log(jnp.asarray([[0.5, 0.25, 0.15, 0.07, 0.03]], jnp.float32))
    keys = jax.random.split(jax.random.key(0), 4000)
    draw = jax.jit(jax.vmap(lambda k: sample_token(logits, k, jnp.float32(1.0), jnp.float32(0.8))))
    tokens, behaviour, processed = draw(keys)
    freq = np.bincount(np.asarray(tokens[:, 0]), minlength=5) / 4000
    # Nucleus at 0.8: {0.5, 0.25, 0.15} (mass before 0.15 is 0.75 < 0.8), renormalised over 0.9.
    np.testing.assert_allclose(freq, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0], atol=0.03)
    picked = np.asarray(tokens[:, 0])
    np.testing.assert_allclose(np.asarray(behaviour[:, 0]), np.log([0.5, 0.25, 0.15, 0.07, 0.03])[picked], atol=1e-5)
    np.testing.assert_allclose(np.asarray(processed[:, 0]), np.log(np.array([0.5, 0.25, 0.15, 1, 1]) / 0.9)[picked],
                               atol=1e-5)


def test_temperature_sharpens_the_distribution():
    logits = jnp.log(jnp.asarray([[0.6, 0.4]], jnp.float32))
    keys = jax.random.split(jax.random.key(1), 4000)
    draw = jax.jit(jax.vmap(lambda k: sample_token(logits, k, jnp.float32(0.5), jnp.float32(1.0))[0]))
    freq = float(np.mean(np.asarray(draw(keys)) == 0))
    assert freq == pytest.approx(0.36 / (0.36 + 0.16), abs=0.03)  # p^(1/T) renormalised


def test_stop_token_and_per_sequence_caps(sampler):
    greedy = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10))
    stop = greedy[0].token_ids[3]
    first = greedy[0].token_ids.index(stop)
    outs = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop,)),
                            max_new_tokens=[10, 2, 5])
    assert outs[0].token_ids == greedy[0].token_ids[: first + 1] and outs[0].finish_reason == "stop_token"
    for r, cap in ((1, 2), (2, 5)):
        ids = greedy[r].token_ids
        expect = ids[: min(cap, ids.index(stop) + 1 if stop in ids[:cap] else cap)]
        assert outs[r].token_ids == expect
        np.testing.assert_allclose(outs[r].raw_logprobs, greedy[r].raw_logprobs[: len(expect)], atol=1e-5)


def test_stop_string_cuts_at_the_completing_token(sampler):
    greedy = sampler.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=40))[0]
    text = TOK.decode(greedy.token_ids)
    assert len(text) >= 2
    needle = text[20:22] if len(text) >= 22 else text[-2:]  # a random model may emit few printable bytes
    sampler.stop_check_steps = 8
    out = sampler.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=40, stop_strings=(needle,)))[0]
    k = len(out.token_ids)
    assert out.finish_reason == "stop_string"
    assert out.token_ids == greedy.token_ids[:k]
    assert needle in TOK.decode(out.token_ids) and needle not in TOK.decode(out.token_ids[:-1])


def test_multi_turn_rollout_compiles_once_per_bucket(model):
    sampler = JaxSampler(model, TOK, min_prompt_bucket=256, min_new_bucket=16)
    prompts = [prompt_ids(TOK, "sys", "task a"), prompt_ids(TOK, None, "task bb")]
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(TOK.eos_id,), seed=1)
    for turn in range(4):
        outs = sampler.generate(prompts, params)
        prompts = [next_prompt(TOK, p, o.token_ids, f"obs {turn}") for p, o in zip(prompts, outs)]
    assert 128 < max(len(p) for p in prompts) <= 256  # grew past 128 tokens, still one bucket
    assert sampler.compile_counts == {"prefill": 1, "decode": 1}
    sampler.generate(prompts + prompts[:1], params)  # 3 rows -> batch bucket 4: one new compile each
    assert sampler.compile_counts == {"prefill": 2, "decode": 2}


def test_bad_requests_are_rejected_clearly(sampler):
    with pytest.raises(ValueError, match="prompt 1 has ids \\[9999\\]"):
        sampler.generate([[1], [9999]], SamplingParams())
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        sampler.generate([[1]], SamplingParams(max_new_tokens=CFG.max_seq_len))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="needs 1 positive entries"):
        sampler.generate([[1]], SamplingParams(), max_new_tokens=[1, 2])


def test_vllm_adapter_says_what_is_missing():
    with pytest.raises(VllmUnavailableError, match="pip install vllm-tpu"):
        VllmEngine("/nonexistent/model")


def test_vllm_adapter_against_a_stand_in_vllm(monkeypatch, model):
    """vllm cannot be installed here: a stand-in module checks what the adapter asks of it (prefix
    caching on, processed log-probs, weight sync then a prefix-cache reset)."""
    import sys
    import types

    calls = {}

    class LLM:
        def __init__(self, **kw):
            calls["init"] = kw

        def generate(self, requests, sampling, use_tqdm=False):
            step = types.SimpleNamespace(logprob=-0.5)
            seq = types.SimpleNamespace(token_ids=[7, 2], logprobs=[{7: step}, {2: step}], finish_reason="stop",
                                        stop_reason=2)
            return [types.SimpleNamespace(outputs=[seq]) for _ in requests]

        def collective_rpc(self, method, args=()):
            calls["rpc"] = (method, len(args[0]))

        def reset_prefix_cache(self):
            calls["reset"] = True

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw))
    engine = VllmEngine("/models/x")
    assert calls["init"]["enable_prefix_caching"] and calls["init"]["logprobs_mode"] == "processed_logprobs"
    out = engine.submit([1, 2], SamplingParams(stop_token_ids=(2,)), episode_id="e").result(timeout=10)
    assert out.token_ids == [7, 2] and out.logprobs == out.raw_logprobs == [-0.5, -0.5]
    assert out.finish_reason == "stop_token"
    engine.update_weights(model)
    assert calls["rpc"][0] == "tr_load_weights" and calls["rpc"][1] > 0 and calls["reset"]


def test_update_weights_takes_a_param_dict_without_recompiling(model):
    sampler = JaxSampler(model, TOK, min_prompt_bucket=32, min_new_bucket=16)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    sampler.generate(PROMPTS, greedy)
    other = Decoder(CFG, rngs=nnx.Rngs(3))
    sampler.update_weights(nnx.to_pure_dict(nnx.state(other, nnx.Param)))  # TrainState.actor_params
    outs = sampler.generate(PROMPTS, greedy)
    assert outs == JaxSampler(other, TOK, min_prompt_bucket=32, min_new_bucket=16).generate(PROMPTS, greedy)
    assert sampler.compile_counts == {"prefill": 1, "decode": 1}
    with pytest.raises(ValueError, match="embed_tokens.*float32\\[3\\]"):
        sampler.update_weights({**nnx.to_pure_dict(nnx.state(model, nnx.Param)), "embed_tokens": np.zeros(3, np.float32)})
