"""Benchmark: TB-GAE and token GAE against a vmapped rlax GAE and a plain numpy loop.

All run on the same ``[B, L]`` batch (default ``[256, 8192]``) of packed multi-turn trajectories in
one process. Prints the median wall time of each and its ratio to the rlax GAE.

Run:  .venv/bin/python bench/bench_gae.py [--batch 256] [--length 8192] [--repeats 7]

The numpy loop is slow, so it is timed on ``--numpy-rows`` rows and scaled linearly to the full
batch (the loop is row-independent); the output says so.
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
import rlax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tr.rl.advantages import tb_gae, token_gae  # noqa: E402

GAMMA_TURN, LAM_TURN = 0.99, 0.95


def make_batch(batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Packed episodes: prompt, then turns of action tokens and observation tokens; random lengths."""
    rng = np.random.default_rng(seed)
    actor_mask = np.zeros((batch, length), bool)
    turn_ids = np.zeros((batch, length), np.int32)
    dones = np.zeros((batch, length), bool)
    rewards = np.zeros((batch, length), np.float32)
    for b in range(batch):
        pos = 0
        while pos < length:
            pos += int(rng.integers(20, 200))  # prompt
            turn = 0
            num_turns = int(rng.integers(1, 12))
            last_action = -1
            while turn < num_turns and pos < length:
                turn += 1
                n_act = int(rng.integers(5, 150))
                end = min(pos + n_act, length)
                actor_mask[b, pos:end] = True
                turn_ids[b, pos:end] = turn
                last_action = end - 1
                pos = end
                n_obs = int(rng.integers(0, 400))
                end = min(pos + n_obs, length)
                turn_ids[b, pos:end] = turn
                pos = end
            if last_action >= 0:
                dones[b, last_action] = True
                rewards[b, last_action] = rng.random() * 2.0
    values = rng.normal(size=(batch, length)).astype(np.float32)
    return dict(rewards=rewards, values=values, actor_mask=actor_mask, turn_ids=turn_ids, dones=dones)


def numpy_tb_gae(rewards, values, actor_mask, turn_ids, dones, gamma_turn, lam_turn):
    """The obvious per-row, per-token loop (the baseline a researcher would write first)."""
    advantages = np.zeros(rewards.shape, np.float32)
    for b in range(rewards.shape[0]):
        v_next = a_next = 0.0
        turn_next = -1
        for j in range(rewards.shape[1] - 1, -1, -1):
            if not actor_mask[b, j]:
                continue
            same = turn_ids[b, j] == turn_next
            g, lam = (1.0, 1.0) if same else (gamma_turn, lam_turn)
            not_done = 0.0 if dones[b, j] else 1.0
            delta = rewards[b, j] + g * not_done * v_next - values[b, j]
            a_next = delta + g * lam * not_done * a_next
            advantages[b, j] = a_next
            v_next, turn_next = values[b, j], turn_ids[b, j]
    return advantages


def median_seconds_interleaved(fns: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each zero-argument function.

    The functions take turns within every round, so a busy machine slows them alike. CPU time
    (this process, all threads) is the steadier measure on a shared machine.
    """
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile and warm up
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn())
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--numpy-rows", type=int, default=4)
    args = parser.parse_args()
    if args.batch < 1 or args.length < 2 or args.repeats < 1 or not 1 <= args.numpy_rows <= args.batch:
        parser.error(f"need batch>=1, length>=2, repeats>=1, 1<=numpy-rows<=batch; got {vars(args)}")

    host = make_batch(args.batch, args.length)
    dev = {k: jnp.asarray(v) for k, v in host.items()}

    def tb(method):
        return jax.jit(lambda d: tb_gae(
            d["rewards"], d["values"], d["actor_mask"], d["turn_ids"], d["dones"],
            gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN, method=method).advantages)

    tb_blocked, tb_scan, tb_assoc = tb("blocked"), tb("scan"), tb("associative")
    tok_scan = jax.jit(lambda d: token_gae(  # the default method, like tb_gae
        d["rewards"], d["values"], d["actor_mask"], d["dones"], gamma=GAMMA_TURN, lam=LAM_TURN
    ).advantages)

    def rlax_gae(d):
        # Textbook GAE on every position of the same tokens (bootstrap value 0 past the end).
        discount = GAMMA_TURN * (1.0 - d["dones"].astype(jnp.float32))
        values_tp1 = jnp.concatenate([d["values"], jnp.zeros((d["values"].shape[0], 1))], axis=1)
        return jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(0, 0, None, 0))(
            d["rewards"], discount, LAM_TURN, values_tp1)

    rlax_jit = jax.jit(rlax_gae)

    # Correctness before speed: the jitted estimators agree with the loop on the timed rows.
    rows = slice(0, args.numpy_rows)
    subset = [host[k][rows] for k in ("rewards", "values", "actor_mask", "turn_ids", "dones")]
    reference = numpy_tb_gae(*subset, GAMMA_TURN, LAM_TURN)
    for name, fn in (("blocked", tb_blocked), ("scan", tb_scan), ("associative", tb_assoc)):
        err = float(np.max(np.abs(np.asarray(fn(dev))[rows] - reference)))
        if err > 1e-3:
            raise SystemExit(f"tb_gae method={name} disagrees with the numpy loop: max |diff| = {err}")

    candidates = {
        "tb_gae (blocked, default)": lambda: tb_blocked(dev),
        "tb_gae (scan)": lambda: tb_scan(dev),
        "tb_gae (associative_scan)": lambda: tb_assoc(dev),
        "token_gae (blocked, actor_mask)": lambda: tok_scan(dev),
        "rlax GAE (vmapped)": lambda: rlax_jit(dev),
        "numpy loop": lambda: numpy_tb_gae(*subset, GAMMA_TURN, LAM_TURN),
    }
    medians = median_seconds_interleaved(candidates, args.repeats)
    scale = args.batch / args.numpy_rows
    medians["numpy loop (scaled)"] = tuple(t * scale for t in medians.pop("numpy loop"))
    base_wall, base_cpu = medians["rlax GAE (vmapped)"]
    np_wall, np_cpu = medians["numpy loop (scaled)"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"batch [{args.batch}, {args.length}], {args.repeats} interleaved rounds, backend "
          f"{jax.default_backend()} ({len(jax.devices())} device(s)), jax {jax.__version__}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f}")
    print(f"numpy loop timed on {args.numpy_rows} of {args.batch} rows and scaled x{scale:g} "
          f"to the full batch")
    print()
    print("| estimator                       | wall ms | / rlax | numpy / this | CPU ms | / rlax "
          "| numpy / this |")
    print("|---------------------------------|--------:|-------:|-------------:|-------:|-------:"
          "|-------------:|")
    for name, (wall, cpu) in medians.items():
        print(f"| {name:<31} | {wall * 1e3:7.1f} | {wall / base_wall:6.2f} | {np_wall / wall:12.1f} "
              f"| {cpu * 1e3:6.1f} | {cpu / base_cpu:6.2f} | {np_cpu / cpu:12.1f} |")
    tb_wall, tb_cpu = medians["tb_gae (blocked, default)"]
    print()
    for label, tb_t, base_t, np_t in (("wall", tb_wall, base_wall, np_wall),
                                      ("CPU", tb_cpu, base_cpu, np_cpu)):
        print(f"{label}: tb_gae / rlax = {tb_t / base_t:.2f} (target <= 1.5: "
              f"{'met' if tb_t <= 1.5 * base_t else 'MISSED'}); numpy / tb_gae = {np_t / tb_t:.0f} "
              f"(target >= 50: {'met' if np_t >= 50 * tb_t else 'MISSED'})")

if __name__ == "__main__":
    main()
