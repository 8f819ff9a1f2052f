"""Rollouts over several Docker engines: what spreading sandboxes costs, and an image's first copy.

Runs the scripted teacher on Docker-capable suite tasks with the sandboxes on (a) the engine's
socket only (the baseline), (b) the socket + a TCP endpoint of the same engine (a forwarding
listener on 127.0.0.1), (c) the socket + a second, separate dockerd of this machine (own image
store: the task images are copied there on first use, timed separately).  Prints, per setup, the
median over ``--repeats`` runs of episodes/s, the ratio to the baseline (same process), how the
episodes were placed, and the pass count.  On one host the engines share its CPUs: the ratio
measures the pool's overhead, not a speed-up.

    .venv/bin/python bench/bench_endpoints.py [--episodes 8] [--concurrency 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

SOCKET = "unix:///var/run/docker.sock"
TASKS = ("data-csv-to-json", "ft-normalize-whitespace", "log-status-summary")


def run_once(tasks, episodes: int, concurrency: int, endpoints: tuple, seed: int) -> dict:
    from tr.agent.policies import ScriptedPolicy
    from tr.agent.rollout import RolloutConfig, TaskEnv, group_specs, run_rollouts
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer

    per_task = -(-episodes // len(tasks))
    specs = group_specs(tasks, per_task, seed=seed)[:episodes]
    cfg = RolloutConfig(backend="docker", concurrency=concurrency, progress=False,
                        batch_window_s=0.0, docker_endpoints=endpoints)
    env = TaskEnv("docker", None, endpoints)
    t0 = time.perf_counter()
    out = run_rollouts(specs, ScriptedPolicy(tasks), ChatLayout(ByteTokenizer()), cfg, env=env)
    wall = time.perf_counter() - t0
    env.shutdown()
    placed = collections.Counter(env.placements.values()) if endpoints else {"default": episodes}
    return {"wall": wall, "eps": len(out.records) / wall,
            "passed": sum(bool(r.passed) for r in out.records), "n": len(out.records),
            "placed": dict(placed)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    from docker_engines import EngineUnavailable, SocketProxy, second_dockerd
    from tr.envs.endpoints import EndpointPool
    from tr.envs.images import ensure_base_image
    from tr.envs.tasks import load_suite
    from tr.envs.tasks.runner import docker_image

    ensure_base_image()
    tasks = [t for t in load_suite() if t.id in TASKS]
    images = sorted({docker_image(t) or ensure_base_image() for t in tasks})
    proxy = SocketProxy()
    rows = []

    def measure(setups: list) -> None:
        """Runs every setup once per repeat, interleaved (the machine's load drifts)."""
        runs = {label: [] for label, _ in setups}
        for i in range(args.repeats):
            for label, endpoints in setups:
                runs[label].append(run_once(tasks, args.episodes, args.concurrency, endpoints,
                                            seed=i))
        for label, _ in setups:
            rs = runs[label]
            rows.append((label, statistics.median(r["eps"] for r in rs),
                         statistics.median(r["wall"] for r in rs),
                         sum(r["passed"] for r in rs), sum(r["n"] for r in rs), rs[-1]["placed"]))

    def short(name: str) -> str:
        return "socket" if name == SOCKET else ("tcp" if name == proxy.url else "dockerd-2")

    try:
        run_once(tasks, 2, 2, (), seed=99)                      # warm-up: images, seeds
        setups = [("socket only (baseline)", ()), ("socket + tcp proxy", (SOCKET, proxy.url))]
        copies = []
        with contextlib.ExitStack() as stack:
            try:
                second = stack.enter_context(second_dockerd())
                pool = EndpointPool([SOCKET, second])
                for image in images:
                    t0 = time.perf_counter()
                    pool.ensure_image(second, image)
                    copies.append((image, time.perf_counter() - t0))
                setups.append(("socket + second dockerd", (SOCKET, second)))
            except EngineUnavailable as e:
                print(f"second dockerd unavailable: {e}", file=sys.stderr)
            measure(setups)
    finally:
        proxy.stop()

    base = rows[0][1]
    print(f"{args.episodes} episodes of {list(TASKS)}, concurrency {args.concurrency}, "
          f"median of {args.repeats} runs (seeds 0..{args.repeats - 1})")
    print(f"{'setup':28s} {'episodes/s':>10s} {'wall s':>8s} {'ratio':>6s} {'passed':>8s}  placed")
    for label, eps, wall, passed, n, placed in rows:
        where = ", ".join(f"{short(k) if k != 'default' else k}: {v}" for k, v in placed.items())
        print(f"{label:28s} {eps:10.2f} {wall:8.1f} {eps / base:6.2f} {passed:>4d}/{n:<3d}  {where}")
    for image, seconds in copies:
        print(f"first copy of {image} to the second dockerd (save -> load): {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
