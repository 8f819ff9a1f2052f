"""Benchmark: training tokens/s of the `sft` and `ppo` steps, and checkpoint save/restore times.

Steps (`tr.train.compile.build_steps`, model `--model`, default the real `tiny` decoder and critic): one jitted
update on `[--batch, --length]` packed multi-turn rows; tokens/s = batch·length / median step time
(after one warm-up, compilation excluded). Baseline: the `sft` step with one micro-batch; the table
gives each step's ratio to it (`ppo` runs the critic forward for targets, then the backward of both
models; `--micro` micro-batches show the cost of exact accumulation).

Checkpoints (`tr.train.checkpoint.StageStore`, model `--ckpt-model`, default `small`, ~97M
parameters, float32): the actor's parameters alone, and a full PPO-stage state (actor and critic
parameters and their Adam states), saved synchronously and restored, median of `--repeats`; for the
asynchronous save also the time until `save()` returns (training may continue from then on).

Run:  .venv/bin/python bench/bench_train.py [--model tiny] [--batch 8] [--length 512]
                                            [--ckpt-model small] [--repeats 5] [--skip-ckpt]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tr.models.config import get_model_config  # noqa: E402
from tr.models.critic import CriticModel  # noqa: E402
from tr.models.decoder import Decoder  # noqa: E402
from tr.train import checkpoint as ckpt  # noqa: E402
from tr.train.compile import build_steps  # noqa: E402
from tr.train.model_fns import nnx_model_fns  # noqa: E402
from tr.train.optim import make_optimizer  # noqa: E402
from tr.train.updates import default_config  # noqa: E402
from tr.train.state import abstract_state, create_train_state  # noqa: E402


def make_batch(rows: int, length: int, vocab: int, seed: int = 0) -> dict[str, jax.Array]:
    """Rows of a prompt, then turns of 20–80 action tokens and 10–200 observation tokens."""
    rng = np.random.default_rng(seed)
    actor_mask = np.zeros((rows, length), bool)
    turn_ids = np.zeros((rows, length), np.int32)
    rewards = np.zeros((rows, length), np.float32)
    dones = np.zeros((rows, length), bool)
    for row in range(rows):
        pos, turn = 32, 0
        while pos < length - 1:
            turn += 1
            end = min(pos + int(rng.integers(20, 80)), length)
            actor_mask[row, pos:end] = True
            turn_ids[row, pos:] = turn
            pos = end + int(rng.integers(10, 200))
        last = np.flatnonzero(actor_mask[row])[-1]
        rewards[row, last], dones[row, last] = rng.uniform(0, 2), True
    return {
        "tokens": jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32),
        "actor_mask": jnp.asarray(actor_mask), "loss_mask": jnp.asarray(actor_mask),
        "turn_ids": jnp.asarray(turn_ids), "rewards": jnp.asarray(rewards),
        "dones": jnp.asarray(dones),
        "logprobs": jnp.asarray(np.log(rng.uniform(1e-3, 1.0, (rows, length))), jnp.float32),
    }


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_steps(args) -> None:
    config = get_model_config(args.model)
    actor = Decoder(config, rngs=nnx.Rngs(0))
    critic = CriticModel(config, rngs=nnx.Rngs(1))
    fns = nnx_model_fns(actor, critic, chunk_size=args.chunk)
    batch = make_batch(args.batch, args.length, config.vocab_size)
    tokens = args.batch * args.length
    rows = []
    for name, micro in (("sft", 1), ("ppo", 1), ("sft", args.micro), ("ppo", args.micro)):
        train_config = default_config()
        train_config.num_micro_batches = micro
        state = create_train_state(
            actor_params=fns.actor_params,
            actor_optimizer=make_optimizer(train_config.actor.optimizer),
            critic_params=fns.critic_params,
            critic_optimizer=make_optimizer(train_config.critic.optimizer))
        step = getattr(build_steps(train_config, actor_logprobs=fns.actor_logprobs,
                                   critic_values=fns.critic_values), name)
        jax.block_until_ready(step(state, batch))   # compile
        seconds = median_time(lambda: step(state, batch), args.repeats)
        rows.append((name, micro, seconds, tokens / seconds))
    base = rows[0][2]
    print(f"\nupdate steps: model {args.model} ({config.param_count() / 1e6:.1f}M params per model), "
          f"batch {args.batch} x {args.length} = {tokens} tokens, {jax.devices()[0].platform}, "
          f"median of {args.repeats}")
    print(f"| step | micro-batches | median step s | tokens/s | time vs sft x1 |")
    print("|---|---|---|---|---|")
    for name, micro, seconds, tps in rows:
        print(f"| {name} | {micro} | {seconds:.3f} | {tps:,.0f} | {seconds / base:.2f} |")


def bench_checkpoint(args) -> None:
    config = get_model_config(args.ckpt_model)

    @jax.jit
    def init(key):
        actor_key, critic_key = jax.random.split(key)
        actor = nnx.state(Decoder(config, rngs=nnx.Rngs(actor_key)), nnx.Param)
        critic = nnx.state(CriticModel(config, rngs=nnx.Rngs(critic_key)), nnx.Param)
        return nnx.to_pure_dict(actor), nnx.to_pure_dict(critic)

    actor_params, critic_params = init(jax.random.key(0))
    opt = make_optimizer(default_config().actor.optimizer)
    full = jax.jit(lambda a, c: create_train_state(actor_params=a, actor_optimizer=opt,
                                                   critic_params=c, critic_optimizer=opt)
                   )(actor_params, critic_params)
    params_only = create_train_state(actor_params=actor_params)
    n_params = sum(x.size for x in jax.tree.leaves(actor_params))
    root = tempfile.mkdtemp(prefix="bench_train_ckpt_")
    rows = []
    try:
        for label, state in (("actor params", params_only),
                             ("actor+critic params+Adam", full)):
            nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
            target = abstract_state(state)
            save_s, async_return_s, async_total_s, restore_s = [], [], [], []
            for rep in range(args.repeats):
                for mode in ("sync", "async"):
                    stage = f"{mode}-{len(rows)}-{rep}"
                    store = ckpt.StageStore(root, stage, async_save=(mode == "async"))
                    start = time.perf_counter()
                    store.save(state, force=True)
                    returned = time.perf_counter() - start
                    store.wait()
                    total = time.perf_counter() - start
                    if mode == "sync":
                        save_s.append(total)
                        start = time.perf_counter()
                        jax.block_until_ready(store.restore(target))
                        restore_s.append(time.perf_counter() - start)
                    else:
                        async_return_s.append(returned)
                        async_total_s.append(total)
                    store.close()
                    shutil.rmtree(os.path.join(root, stage))
            rows.append((label, nbytes, statistics.median(save_s), statistics.median(async_return_s),
                         statistics.median(async_total_s), statistics.median(restore_s)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\ncheckpoints: model {args.ckpt_model} ({n_params / 1e6:.1f}M params per model, "
          f"float32), local disk {root}, median of {args.repeats}")
    print("| contents | MB | sync save s | async save returns s | async save total s | "
          "restore s | save MB/s | restore MB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, nbytes, save, ret, total, restore in rows:
        mb = nbytes / 1e6
        print(f"| {label} | {mb:,.0f} | {save:.2f} | {ret:.2f} | {total:.2f} | {restore:.2f} | "
              f"{mb / save:,.0f} | {mb / restore:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=1024, help="log-prob chunk size")
    parser.add_argument("--micro", type=int, default=4, help="micro-batches for the second rows")
    parser.add_argument("--ckpt-model", default="small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--skip-ckpt", action="store_true")
    args = parser.parse_args()
    if args.batch % args.micro:
        parser.error(f"--batch {args.batch} must be a multiple of --micro {args.micro}")
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start "
          "(timings on a shared host scale with it)")
    if not args.skip_steps:
        bench_steps(args)
    if not args.skip_ckpt:
        bench_checkpoint(args)


if __name__ == "__main__":
    main()
