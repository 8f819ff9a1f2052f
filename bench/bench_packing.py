"""Benchmark: one RPR update batch (targets + `epochs x mini_batches` PPO updates) with one episode
per padded row against episodes packed several to a row (`arrays.pack_multiple`), same process.

The model is the gym's (`tr.models.embedded.MODEL`, the embedded default's size; random weights:
time does not depend on them). The episodes are a run's own rollouts (`--records`, JSONL shards
such as RUN/rpr1/rollouts/*.jsonl) or, without them, synthetic gym-like episodes of 1-5 turns and
--min-tokens..--max-tokens tokens. Prints the median seconds per batch of each layout (after one
warm-up per shape, which holds the compile), rows and fill, and the ratio to the padded layout.

Run:  .venv/bin/python bench/bench_packing.py [--records RUN/rpr1/rollouts/00001.jsonl ...]
                                             [--rows 32] [--length 1024] [--multiple 8]
                                             [--mini-batches 2] [--epochs 1] [--repeats 3]
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

from tr.agent.records import EpisodeRecord, EpisodeStatus, Segment, read_shard  # noqa: E402
from tr.models.config import get_model_config  # noqa: E402
from tr.models.critic import CriticModel  # noqa: E402
from tr.models.decoder import Decoder  # noqa: E402
from tr.models import embedded  # noqa: E402
from tr.stages.arrays import training_arrays  # noqa: E402
from tr.train.compile import build_steps  # noqa: E402
from tr.train.model_fns import nnx_model_fns  # noqa: E402
from tr.train.optim import make_optimizer  # noqa: E402
from tr.train.updates import default_config  # noqa: E402
from tr.train.compile import run_epochs  # noqa: E402
from tr.train.state import create_train_state  # noqa: E402


def synthetic_records(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[EpisodeRecord]:
    """Gym-like episodes: a prompt, then 1-5 turns of a 20-60-token action and an observation."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        target = int(rng.integers(lo, hi + 1))
        prompt = int(rng.integers(60, 120))
        segs = [Segment("prompt", rng.integers(4, vocab, prompt).tolist(), turn=0)]
        used, turn = prompt, 0
        while used < target and turn < 5:
            turn += 1
            a = int(min(rng.integers(20, 61), max(1, target - used)))
            segs.append(Segment("action", rng.integers(4, vocab, a).tolist(), turn=turn,
                                source="policy", logprobs=(-rng.random(a)).tolist()))
            used += a
            o = int(min(rng.integers(30, 150), max(0, target - used)))
            if o and used + o < target:
                segs.append(Segment("observation", rng.integers(4, vocab, o).tolist(), turn=turn))
                used += o
        out.append(EpisodeRecord(episode_id=f"e{i}", task_id=f"t{i}", passed=bool(i % 4 == 0),
                                 status=EpisodeStatus.VERIFIED_PASS if i % 4 == 0
                                 else EpisodeStatus.VERIFIED_FAIL, segments=segs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", nargs="*", default=[])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--multiple", type=int, default=8)
    parser.add_argument("--mini-batches", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-tokens", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=750)
    args = parser.parse_args()

    config = get_model_config(embedded.MODEL)
    if args.records:
        records = [r for path in args.records for r in read_shard(path)][:args.rows]
        source = f"{len(records)} episodes from {len(args.records)} shard(s)"
    else:
        records = synthetic_records(args.rows, args.min_tokens, args.max_tokens, config.vocab_size)
        source = f"{len(records)} synthetic episodes of {args.min_tokens}-{args.max_tokens} tokens"
    rewards = [float(r.passed) for r in records]
    actor, critic = Decoder(config, rngs=nnx.Rngs(0)), CriticModel(config, rngs=nnx.Rngs(1))
    fns = nnx_model_fns(actor, critic, chunk_size=min(1024, config.max_seq_len))
    train = default_config()
    train.ppo.mini_batches, train.ppo.epochs = args.mini_batches, args.epochs
    steps = build_steps(train, actor_logprobs=fns.actor_logprobs,
                        critic_values=fns.critic_values)
    state0 = create_train_state(actor_params=fns.actor_params, critic_params=fns.critic_params,
                                actor_optimizer=make_optimizer(train.actor.optimizer),
                                critic_optimizer=make_optimizer(train.critic.optimizer))

    def one_batch(batch):
        prepared = {**batch, **steps.targets(state0, batch)}
        state, history = run_epochs(steps.ppo, state0, prepared, epochs=args.epochs,
                                    mini_batches=args.mini_batches, seed=0)
        jax.block_until_ready(state.step)
        return history

    print(f"model {embedded.MODEL} ({config.d_model}d x {config.n_layers} layers), {source}; "
          f"{args.epochs} epoch(s) x {args.mini_batches} mini-batches per batch; "
          f"median of {args.repeats}")
    results = {}
    for name, multiple in (("padded", 0), ("packed", args.multiple)):
        arrays, stats = training_arrays(records, rewards, rows=args.rows,
                                        length=args.length, pack_multiple=multiple)
        batch = {k: jnp.asarray(v) for k, v in arrays.items()}
        start = time.perf_counter()
        one_batch(batch)                                   # compile + first run
        first = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            one_batch(batch)
            times.append(time.perf_counter() - start)
        results[name] = (statistics.median(times), first, stats)
    base = results["padded"][0]
    print(f"{'layout':8} {'rows':>5} {'fill':>6} {'first (compile) s':>18} {'median s':>9} "
          f"{'ratio':>6}")
    for name, (median, first, stats) in results.items():
        print(f"{name:8} {stats['rows']:5d} {stats['fill']:6.3f} {first:18.2f} {median:9.2f} "
              f"{median / base:6.2f}")


if __name__ == "__main__":
    main()
