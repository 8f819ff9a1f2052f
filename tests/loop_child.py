"""A tiny Terminal-RSI pipeline for the stage tests: `init` Base, critic `warmup`, `rpr-1`.

    python tests/loop_child.py --run_dir D [--stages init,warmup,rpr] [--ppo_iterations N]

Real rollouts of the (untrained, 1-layer) tiny model on short built-in tasks in local sandboxes,
one episode at a time (so a run is a pure function of its seed), real checkpoints. Prints
`DONE <json of the summaries>` at the end; killed and started again, it resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

TRAIN_IDS = ["build-makefile-tabs", "py-fix-script", "git-commit-selected"]
VAL_IDS = ["log-top-ips"]


def pipeline_config(stages=("init", "warmup", "rpr"), ppo_iterations=2, calibration=1):
    import ml_collections

    small = {"name": "tiny", "overrides": dict(n_layers=1, d_model=32, n_heads=2, n_kv_heads=1,
                                               head_dim=16, d_ff=64)}
    entries = {
        "init": {"name": "base", "kind": "init", "init": {"critic_bias": 0.5}},
        "warmup": {"name": "warmup", "kind": "warmup", "actor_from": "base",
                   "critic_from": "base"},
        "rpr": {"name": "rpr-1", "kind": "rpr", "actor_from": "base",
                "critic_from": "warmup" if "warmup" in stages else "base",
                "rpr": {"calibration_updates": calibration, "iterations": ppo_iterations,
                        "reward": "spr"},
                "rollout": {"oversample": 1}},   # N' = 3 launched, the first N = 2 kept
    }
    return ml_collections.ConfigDict({
        "job": "pipeline",
        "stage_defaults": {
            "model": small,
            "tasks": {"ids": TRAIN_IDS + VAL_IDS},
            "rollout": {"concurrency": 1, "tasks_per_iteration": 2, "max_output_tokens": 16,
                        "max_turns": 2},
            "arrays": {"rows": 4, "length": 2048},
            "eval": {"count": 1, "every": 0},
            "train": {"actor": {"optimizer": {"learning_rate": 1e-3}},
                      "critic": {"optimizer": {"learning_rate": 1e-3}},
                      "ppo": {"epochs": 2, "mini_batches": 2},
                      "logprob_chunk_size": 512},
        },
        "stages": [entries[s] for s in stages],
    })


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_dir", required=True)
    parser.add_argument("--stages", default="init,warmup,rpr")
    parser.add_argument("--ppo_iterations", type=int, default=2)
    args = parser.parse_args()
    import jax

    if os.environ.get("TR_TEST_JAX_CACHE"):
        jax.config.update("jax_compilation_cache_dir", os.environ["TR_TEST_JAX_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    from tr.stages import pipeline

    config = pipeline_config(tuple(args.stages.split(",")), args.ppo_iterations)
    summaries = pipeline.run(config, pathlib.Path(args.run_dir))
    print("DONE " + json.dumps(summaries, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
