"""Benchmark: KV-cache decoding vs recomputing the full prefix each step, and training throughput.

Decoding (greedy, `--new-tokens` tokens after a `--prompt`-token prompt, batch `--batch`):
  cache      `JaxSampler.generate`: one prefill, then one token per step through the KV cache,
             the whole loop compiled (`lax.while_loop`).
  recompute  the obvious baseline: each step runs the full decoder over the whole prefix (padded up
             to a multiple of 64 so only a few shapes compile) and takes the last logits.
Training: jitted forward+backward of the chunked token log-prob loss (`token_logprobs`) and of the
critic's value loss on `[--train-batch, --train-length]`.
Every timing is the median of `--repeats` runs after one warm-up (compilation excluded); the ratio
is against the recompute baseline measured in the same process.

Run:  .venv/bin/python bench/bench_models.py [--model tiny] [--new-tokens 512] [--batch 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tr.models.config import get_model_config  # noqa: E402
from tr.models.critic import CriticModel  # noqa: E402
from tr.models.decoder import Decoder, token_logprobs  # noqa: E402
from tr.sampling.sampler import JaxSampler, SamplingParams  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up / compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    config = get_model_config(args.model)
    model = Decoder(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=args.prompt).tolist() for _ in range(args.batch)]
    n_new = args.new_tokens

    sampler = JaxSampler(model, min_prompt_bucket=args.prompt, min_new_bucket=n_new)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=n_new)
    cache_out: list = []
    t_cache = median_seconds(lambda: cache_out.__setitem__(slice(None), sampler.generate(prompts, greedy)),
                             args.repeats)

    graphdef, state = nnx.split(model)

    @jax.jit
    def last_token_argmax(state, tokens, last):
        logits = nnx.merge(graphdef, state)(tokens)
        return jnp.argmax(jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0], axis=-1)

    def recompute() -> list[list[int]]:
        seqs = np.zeros((args.batch, args.prompt + n_new), np.int32)
        seqs[:, : args.prompt] = np.asarray(prompts)
        for t in range(n_new):
            length = args.prompt + t
            padded = -(-length // 64) * 64
            nxt = last_token_argmax(state, jnp.asarray(seqs[:, :padded]), jnp.full((args.batch,), length - 1))
            seqs[:, length] = np.asarray(nxt)
        return seqs[:, args.prompt:].tolist()

    t_recompute = median_seconds(recompute, max(1, args.repeats - 2))
    same = recompute() == [c.token_ids for c in cache_out]

    tokens = jnp.asarray(rng.integers(0, config.vocab_size, size=(args.train_batch, args.train_length)), jnp.int32)

    @jax.jit
    def actor_step(state, tokens):
        def loss(s):
            logp, _ = token_logprobs(nnx.merge(graphdef, s), tokens, chunk_size=1024)
            return -jnp.mean(logp)
        return jax.value_and_grad(loss)(state)

    critic = CriticModel(config, rngs=nnx.Rngs(1))
    c_graph, c_state = nnx.split(critic)

    @jax.jit
    def critic_step(state, tokens):
        def loss(s):
            return 0.5 * jnp.mean(nnx.merge(c_graph, s)(tokens) ** 2)
        return jax.value_and_grad(loss)(state)

    t_actor = median_seconds(lambda: jax.block_until_ready(actor_step(state, tokens)), args.repeats)
    t_critic = median_seconds(lambda: jax.block_until_ready(critic_step(c_state, tokens)), args.repeats)
    n_train = args.train_batch * args.train_length

    print(f"model {config.name} ({config.param_count() / 1e6:.1f}M params), backend {jax.default_backend()}, "
          f"{len(jax.devices())} device(s), median of {args.repeats} after warm-up")
    print(f"decode: batch {args.batch}, prompt {args.prompt}, {n_new} new tokens (greedy; outputs identical: {same})")
    print(f"| method | seconds | tokens/s | speed-up vs recompute |")
    print(f"|---|---|---|---|")
    total = args.batch * n_new
    print(f"| KV cache (JaxSampler) | {t_cache:.3f} | {total / t_cache:,.0f} | {t_recompute / t_cache:.1f}x |")
    print(f"| recompute full prefix | {t_recompute:.3f} | {total / t_recompute:,.0f} | 1.0x |")
    print(f"train: batch {args.train_batch} x {args.train_length} tokens, forward+backward")
    print(f"| step | seconds | tokens/s |")
    print(f"|---|---|---|")
    print(f"| actor (chunked log-prob loss) | {t_actor:.3f} | {n_train / t_actor:,.0f} |")
    print(f"| critic (value loss) | {t_critic:.3f} | {n_train / t_critic:,.0f} |")


if __name__ == "__main__":
    main()
