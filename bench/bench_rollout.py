"""Rollout engine throughput: the scripted teacher on the built-in suite in local sandboxes.

Reports, per concurrency level (default 1 and 8), the median over ``--repeats`` runs of episodes/s
and environment steps/s (wall clock), the ratio to concurrency 1 (the baseline, same process), and
where episode time goes: sandboxes (set-up + commands + snapshot + verifier), sampling (waiting
for and running the policy, batching included) and bookkeeping (the rest: harness, records,
tokenisation), as shares of the summed episode wall time.

Rows for two suites, same process: the built-in suite (pytest verifiers) and the gym's test split
(`tr.envs.gym`, stdlib check runner; issue 11's target is >= 10 verified episodes/s at 8).

    .venv/bin/python bench/bench_rollout.py [--concurrency 1 8] [--repeats 3] [--backend local]
                                            [--suites builtin gym] [--gym-count 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_once(tasks, concurrency: int, backend: str) -> dict:
    from tr.agent.policies import ScriptedPolicy
    from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer

    cfg = RolloutConfig(backend=backend, concurrency=concurrency, progress=False, batch_window_s=0.0)
    t0 = time.perf_counter()
    out = run_rollouts(group_specs(tasks, 1), ScriptedPolicy(tasks), ChatLayout(ByteTokenizer()), cfg)
    wall = time.perf_counter() - t0
    recs = out.records
    failed = sorted(r.task_id for r in recs if not r.passed)
    if failed:
        print(f"  concurrency {concurrency}: not passed: {failed}", file=sys.stderr)
    steps = sum(r.num_turns for r in recs)
    ep_time = sum(r.wall_s for r in recs)
    sandbox = sum(r.setup_s + r.env_s + r.verify_s for r in recs)
    sampling = sum(r.gen_s for r in recs)
    return {
        "episodes": len(recs), "passed": sum(bool(r.passed) for r in recs),
        "infra": sum(r.status.value == "infra_failure" for r in recs),
        "wall_s": wall, "eps_per_s": len(recs) / wall, "steps_per_s": steps / wall,
        "sandbox_share": sandbox / ep_time, "sampling_share": sampling / ep_time,
        "bookkeeping_share": 1.0 - (sandbox + sampling) / ep_time,
        "mean_batch": statistics.mean(out.batch_sizes) if out.batch_sizes else 0.0,
    }


def load_tasks(suite: str, gym_count: int):
    """'builtin', 'gym' (the gym's test split) or a task directory tree."""
    if suite == "gym":
        from tr.envs import gym

        return gym.split_tasks("test", gym_count)
    from tr.envs.tasks import load_suite

    return load_suite(None if suite == "builtin" else suite)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", default="local")
    p.add_argument("--suites", nargs="+", default=["builtin", "gym"],
                   help="'builtin', 'gym' or task directory trees")
    p.add_argument("--gym-count", type=int, default=64)
    args = p.parse_args(argv)

    print(f"{'suite':>8} {'conc':>4} {'episodes':>8} {'pass':>4} {'infra':>5} {'wall s':>7} {'ep/s':>6} "
          f"{'steps/s':>7} {'x base':>6} {'sandbox':>7} {'sampling':>8} {'bookkeep':>8} {'batch':>5}")
    for suite in args.suites:
        tasks = load_tasks(suite, args.gym_count)
        print(f"suite {suite}: {len(tasks)} tasks, backend {args.backend}, {args.repeats} repeat(s), "
              f"medians shown; load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
        rows = []
        for c in args.concurrency:
            runs = [run_once(tasks, c, args.backend) for _ in range(args.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append((c, med))
        base = rows[0][1]
        name = os.path.basename(suite.rstrip("/"))[:8]
        for c, m in rows:
            print(f"{name:>8} {c:>4} {m['episodes']:>8.0f} {m['passed']:>4.0f} {m['infra']:>5.0f} "
                  f"{m['wall_s']:>7.2f} {m['eps_per_s']:>6.2f} {m['steps_per_s']:>7.2f} "
                  f"{m['eps_per_s'] / base['eps_per_s']:>6.2f} {100 * m['sandbox_share']:>6.1f}% "
                  f"{100 * m['sampling_share']:>7.1f}% {100 * m['bookkeeping_share']:>7.1f}% "
                  f"{m['mean_batch']:>5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
