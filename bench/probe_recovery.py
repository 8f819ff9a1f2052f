"""Probe: can a ReTerm run's actor recover from its *own* failures on `train`?

ReTerm-GRPO's recovery groups come from the queue, which holds the training policy's failures of
original groups (rollout temperature 1.0).  A group whose G rollouts all fail has zero
group-normalised advantages and adds no gradient, so this probe measures the per-attempt pass
rate of recovery rollouts from such states, at each temperature asked for:

  1. the actor of stage --stage (default `sft`) of RUN attempts --tasks `train` tasks once at
     temperature 1.0, keeping each failure's pre-verifier snapshot s_f and history h_f;
  2. from every failure, --k recovery attempts (restored s_f, the last `recovery.history_turns`
     turns of h_f, the condensed recovery prompt) at each --temperature;
  3. prints Recovery@k, the attempt pass rate, and P(a group of G has a success) = 1 - (1 - p)^G
     for G in 4, 16.

Run:  .venv/bin/python bench/probe_recovery.py RUN [--stage sft] [--tasks 24] [--k 4]
                                               [--temperature 1.0 --temperature 0.6]
RUN is a finished `experiments/reterm.py` work directory (config.json, the stage's checkpoints).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    import ml_collections

    from tr.agent import recovery
    from tr.envs import gym
    from tr.stages import reterm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=pathlib.Path)
    parser.add_argument("--stage", default="sft")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, action="append")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    temperatures = args.temperature or [1.0, 0.6]
    config_path = args.run / "config.json"
    if not config_path.exists():
        print(f"error: {config_path} does not exist (RUN must be a reterm work directory)",
              file=sys.stderr)
        return 2
    config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
    try:
        rt = reterm.runtime(reterm.parent_manifest(args.run, args.stage),
                            concurrency=int(config.concurrency),
                            max_output_tokens=int(config.eval.max_output_tokens))
    except reterm.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rt.actor.set_params(reterm.load_params(args.run, args.stage, rt))
    tasks = gym.split_tasks("train", args.tasks, seed=0)
    by_id = {t.id: t for t in tasks}
    history = int(config.recovery.history_turns)
    policy = rt.actor.policy(temperature=1.0, top_p=1.0, seed=args.seed, name="probe")
    rc = reterm.rollout_config(config, policy, rt.system_prompt, snapshot=True)
    failures, stats = recovery.collect_failures(policy, tasks, 1, policy.layout, rc,
                                                seed=args.seed, prefix="probe")
    print(f"{args.run}/{args.stage}: {stats['failures']} failures of {stats['episodes']} train "
          f"episodes at temperature 1.0", flush=True)
    try:
        for temperature in temperatures:
            top_p = 1.0 if temperature >= 1.0 else 0.95
            p = rt.actor.policy(temperature=temperature, top_p=top_p, seed=args.seed + 1,
                                name=f"t{temperature}")
            res = recovery.recovery_at_k(p, failures, by_id, args.k, p.layout,
                                         reterm.rollout_config(config, p, rt.system_prompt),
                                         seed=args.seed + 1, history_turns=history)
            counted = [r for r in res["records"] if r.status.counts]
            rate = float(np.mean([bool(r.passed) for r in counted])) if counted else 0.0
            groups = "  ".join(f"P(success in G={g}) {1 - (1 - rate) ** g:.2f}" for g in (4, 16))
            print(f"temperature {temperature} (top-p {top_p}): Recovery@{args.k} "
                  f"{res['recovery_at_k']:.3f} of {res['states']} states, attempts passed "
                  f"{sum(bool(r.passed) for r in counted)}/{len(counted)} ({rate:.3f}); {groups}",
                  flush=True)
    finally:
        recovery.discard_failures(failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
