"""Benchmark: multi-turn rollout sampling, episode KV caches + continuous batching vs re-prefill.

Workload (issue 12): `--episodes` concurrent episodes of `--turns` turns; the first prompt and every
observation are `--obs` tokens, each turn generates a length drawn from [`--min-new`, `--max-new`]
(no stop token, so both engines generate exactly the same number of tokens); the sandbox is a
fixed-delay echo (`--delay-s` of sleep, then the observation), so only sampling is timed. Each
episode is a thread calling the policy through `tr.agent.policies.RequestBatcher`, exactly as
`tr.agent.rollout.run_rollouts` does.

Engines, same model, same process:
  reprefill  `JaxSampler` (today's engine): a batch of waiting requests, every prompt re-read in
             full (left-padded to a power-of-two bucket), the batch decodes until its longest member.
  episode    `EpisodeSampler`: an episode's KV cache lives across turns (only the observation is
             prefilled), requests join and leave `--slots` decode slots as they come and finish.
Each engine first runs the whole workload once (compiles), then timed runs (`--repeats`, the
re-prefill engine `--baseline-repeats`: one of its runs takes ~5 min); medians.

Reported: episodes/s, generated tokens/s, the time share of prefill / decode / waiting (no request
to work on: every episode in its sandbox), and the decode rate with slots joining and leaving vs a
static batch of the same size (all slots admitted together and busy from start to end, same engine,
prompts of the workload's mean request length). The static batch runs right after each timed repeat
of the episode engine and the ratio is taken per repeat (median reported), so load drift on a shared
machine hits both sides of a ratio alike; the same ratio in decoded tokens per process CPU second
(all threads, time spent inside the compiled decode calls) is printed beside it, as it barely moves
with load.

Run:  .venv/bin/python bench/bench_sampling.py [--episodes 32 --turns 8 --obs 200 --slots 32]
      (`--decode-buckets 1 --refill-steps 2`: the engine as it was before active-row decode)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tr.agent.harness import GenerationRequest  # noqa: E402
from tr.agent.policies import ModelPolicy, RequestBatcher  # noqa: E402
from tr.models.config import get_model_config  # noqa: E402
from tr.models.decoder import Decoder  # noqa: E402
from tr.models.tokenizer import ByteTokenizer  # noqa: E402
from tr.sampling.sampler import JaxSampler  # noqa: E402
from tr.sampling.slots import EpisodeSampler  # noqa: E402


class Timed:
    """Wraps a compiled function: wall and process CPU seconds spent in it (results awaited)."""

    def __init__(self, fn):
        self.fn, self.seconds, self.cpu_s = fn, 0.0, 0.0

    def __call__(self, *a, **kw):
        t0, c0 = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(self.fn(*a, **kw))
        self.seconds += time.perf_counter() - t0
        self.cpu_s += time.process_time() - c0
        return out


def workload(args, seed: int):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 256, args.obs).tolist() for _ in range(args.episodes)]
    obs = [[rng.integers(0, 256, args.obs).tolist() for _ in range(args.turns)] for _ in range(args.episodes)]
    caps = rng.integers(args.min_new, args.max_new + 1, size=(args.episodes, args.turns)).tolist()
    return prompts, obs, caps


def run(policy, args, seed: int) -> dict:
    """All episodes once; returns wall seconds and generated tokens."""
    prompts, obs, caps = workload(args, seed)
    batcher = RequestBatcher(policy, max_batch=args.episodes, window_s=0.005)
    generated = [0] * args.episodes

    def episode(e: int) -> None:
        batcher.register()
        try:
            ctx = list(prompts[e])
            for t in range(args.turns):
                req = GenerationRequest(messages=(), prompt_tokens=tuple(ctx), max_tokens=caps[e][t],
                                        episode_id=f"ep{seed}-{e}", seed=e, turn=t + 1)
                gen = batcher.generate(req)
                generated[e] += len(gen.tokens)
                time.sleep(args.delay_s)  # the sandbox: a fixed-delay echo
                ctx = ctx + list(gen.tokens) + obs[e][t]
        finally:
            batcher.unregister()
            if hasattr(policy, "end_episode"):
                policy.end_episode(f"ep{seed}-{e}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.episodes) as pool:
        list(pool.map(episode, range(args.episodes)))
    wall = time.perf_counter() - t0
    batcher.close()
    return {"wall_s": wall, "tokens": sum(generated)}


def mean_context(args) -> int:
    """Mean prompt length of the workload's requests (turn t: the first prompt, t answers, t observations)."""
    _, _, caps = workload(args, 0)
    lengths = [args.obs + sum(c[:t]) + t * args.obs for c in caps for t in range(args.turns)]
    return int(round(statistics.mean(lengths)))


def decode_totals(sampler: EpisodeSampler) -> tuple[int, float, float]:
    """Generated tokens, decode wall seconds, decode process CPU seconds, so far."""
    return sampler.stats.generated_tokens, sampler.stats.decode_s, sampler.decode_fn.cpu_s


def static_decode(sampler: EpisodeSampler, args, context: int) -> tuple[int, float, float]:
    """A static batch: `slots` requests admitted together (queued under the engine's lock, so one
    admission takes them all), all `max_new` long, prompts of `context` tokens (the workload's mean:
    decode reads each row's cached slots, so the static batch sits at the same lengths as the
    episodes' requests). Returns its `decode_totals` deltas."""
    rng = np.random.default_rng(1)
    from tr.sampling.sampler import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new, seed=3)
    before = decode_totals(sampler)
    with sampler.admission_lock():
        futures = [sampler.submit(rng.integers(0, 256, context).tolist(), params) for _ in range(sampler.slots)]
    for f in futures:
        f.result()
    return tuple(a - b for a, b in zip(decode_totals(sampler), before))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--obs", type=int, default=200)
    p.add_argument("--min-new", type=int, default=32)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--delay-s", type=float, default=0.05)
    p.add_argument("--slots", type=int, default=None, help="decode slots (default: --episodes)")
    p.add_argument("--decode-steps", type=int, default=8)
    p.add_argument("--refill-steps", type=int, default=4,
                   help="decode steps per call while a free row's episode is in its sandbox")
    p.add_argument("--decode-buckets", type=int, default=8,
                   help="decode computes the active rows rounded up to slots/this (1: every row, as before)")
    p.add_argument("--attention-block", type=int, default=256, help="cache slots read per block in decode/prefill")
    p.add_argument("--prefill-chunk", type=int, default=128, help="tokens per prefill call (episode engine)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline-repeats", type=int, default=1, help="timed runs of the (slow) re-prefill engine")
    p.add_argument("--attention-chunk", type=int, default=512,
                   help="queries per attention block (exact; bounds re-prefill's score memory)")
    p.add_argument("--engines", default="episode,reprefill")
    args = p.parse_args()
    slots = args.slots or args.episodes
    longest = args.obs * (args.turns + 1) + args.max_new * args.turns + 64
    max_len = 1 << (2 * longest - 1).bit_length()  # re-prefill's bucket + new tokens must fit
    config = get_model_config(args.model, max_seq_len=max_len, attention_chunk=args.attention_chunk)
    model = Decoder(config, rngs=nnx.Rngs(0))
    tok = ByteTokenizer(vocab_size=config.vocab_size)
    t_start = time.perf_counter()
    print(f"model {config.name} ({config.param_count() / 1e6:.1f}M params), backend {jax.default_backend()}, "
          f"{os.cpu_count()} CPUs; {args.episodes} episodes x {args.turns} turns, {args.obs}-token observations, "
          f"{args.min_new}-{args.max_new} new tokens/turn, echo delay {args.delay_s}s, slots {slots}; "
          f"median of {args.repeats} (re-prefill {args.baseline_repeats}) after a warm-up run; load average {os.getloadavg()[0]:.1f}", flush=True)

    rows = {}
    for engine in args.engines.split(","):
        if engine == "episode":
            sampler = EpisodeSampler(model, tok, slots=slots, max_new_tokens=args.max_new,
                                     cache_len=longest, decode_steps=args.decode_steps,
                                     attention_block=args.attention_block, prefill_chunk=args.prefill_chunk,
                                     decode_buckets=args.decode_buckets, refill_decode_steps=args.refill_steps)
            t0 = time.perf_counter()
            sampler.precompile(capacity=longest)  # every row bucket: no compile inside a timed run
            sampler.decode_fn = Timed(sampler.decode_fn)  # for its CPU seconds
            print(f"  episode precompile: {time.perf_counter() - t0:.0f}s {dict(sampler.compile_counts)}", flush=True)
        else:
            sampler = JaxSampler(model, tok, min_prompt_bucket=256, min_new_bucket=args.max_new,
                                 min_batch_bucket=args.episodes)
            sampler.prefill_fn, sampler.decode_fn = Timed(sampler.prefill_fn), Timed(sampler.decode_fn)
        policy = ModelPolicy(sampler, tok, temperature=1.0, top_p=1.0, seed=0)
        t0 = time.perf_counter()
        run(policy, args, seed=100)  # warm-up: every bucket compiles
        warm_s = time.perf_counter() - t0
        results = []
        static_context = mean_context(args)
        for r in range(args.repeats if engine == "episode" else args.baseline_repeats):
            if engine == "episode":
                s0, cpu0 = dict(vars(sampler.stats)), sampler.decode_fn.cpu_s
            else:
                s0 = {"prefill_s": sampler.prefill_fn.seconds, "decode_s": sampler.decode_fn.seconds}
            c0 = dict(sampler.compile_counts)
            out = run(policy, args, seed=r)
            out["compiles_in_run"] = sum(sampler.compile_counts.values()) - sum(c0.values())
            if engine == "episode":
                d = {k: v - s0[k] for k, v in vars(sampler.stats).items()}
                out.update(prefill_s=d["prefill_s"], decode_s=d["decode_s"],
                           occupancy=d["generated_tokens"] / max(d["decode_slot_steps"], 1),
                           row_fill=d["generated_tokens"] / max(d["decode_row_steps"], 1),
                           prefill_tokens=d["prefill_tokens"], reused_tokens=d["reused_tokens"],
                           steps_per_call=d["decode_steps"] / max(d["decode_calls"], 1))
                # Right after the run, the static batch: its ratio to this run is this repeat's.
                dyn_cpu = sampler.decode_fn.cpu_s - cpu0
                n, sec, cpu = static_decode(sampler, args, static_context)
                out.update(static_tok_s=n / sec, vs_static=out["tokens"] / out["decode_s"] / (n / sec),
                           vs_static_cpu=out["tokens"] / dyn_cpu / (n / cpu))
            else:
                out.update(prefill_s=sampler.prefill_fn.seconds - s0["prefill_s"],
                           decode_s=sampler.decode_fn.seconds - s0["decode_s"])
            results.append(out)
            print(f"  {engine} run {r}: {out}", flush=True)
        best = {k: statistics.median(o[k] for o in results) for k in results[0]}
        best["warm_s"] = warm_s
        if engine == "episode":
            best["static_context"] = static_context
            best["ratios"] = [(o["vs_static"], o["vs_static_cpu"]) for o in results]
            best["compiles"] = dict(sampler.compile_counts)
            best["capacity"] = sampler.capacity
            best["row_quantum"] = sampler.row_quantum
            sampler.close()
        rows[engine] = best

    print("\n| engine | episodes/s | generated tok/s | prefill | decode | waiting | decode tok/s (in decode) | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for engine, b in rows.items():
        wall = b["wall_s"]
        wait = max(wall - b["prefill_s"] - b["decode_s"], 0.0)
        print(f"| {engine} | {args.episodes / wall:.3f} | {b['tokens'] / wall:,.0f} | {b['prefill_s'] / wall:.0%} | "
              f"{b['decode_s'] / wall:.0%} | {wait / wall:.0%} | {b['tokens'] / b['decode_s']:,.0f} | {wall:.1f} |")
    if "episode" in rows and "reprefill" in rows:
        e, r = rows["episode"], rows["reprefill"]
        print(f"\nepisodes/s ratio episode/reprefill: {r['wall_s'] / e['wall_s']:.2f}x")
    if "episode" in rows:
        e = rows["episode"]
        dyn = e["tokens"] / e["decode_s"]
        print(f"episode engine: slot occupancy while decoding {e['occupancy']:.0%} (rows computed: only the "
              f"active ones, in multiples of {e['row_quantum']} rows; {e['row_fill']:.0%} of computed rows "
              f"produced a token); decode tok/s with slots "
              f"joining/leaving {dyn:,.0f} vs static batch of {slots} at {e['static_context']}-token contexts "
              f"{e['static_tok_s']:,.0f} (medians); prefilled {e['prefill_tokens']:,} tokens, reused "
              f"{e['reused_tokens']:,} from cache; compiles {e['compiles']}")
        print(f"decode with slots joining/leaving vs static batch, per repeat (static run right after): "
              f"wall tok/s {', '.join(f'{w:.0%}' for w, _ in e['ratios'])} -> median {e['vs_static']:.0%}; "
              f"tok per process CPU s {', '.join(f'{c:.0%}' for _, c in e['ratios'])} -> median "
              f"{e['vs_static_cpu']:.0%}")
    print(f"total bench wall time {time.perf_counter() - t_start:.0f}s; load average (1/5/15 min) "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
