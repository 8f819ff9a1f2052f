"""Probe config (not a shipped variant): direct PPO from a finished Base, selected and reported on
`val` (64 tasks, evaluated every 2 iterations), to ask whether more RL data per stage lifts the
tiny policy.

  wide     16 PPO iterations of 64 episodes (32 tasks x 2): 1,024 PPO episodes
  matched  `experiments/terminal_rsi.py:direct_ppo` as shipped: 8 iterations of 32 = 256

Run from the repository root, with a copy of a default run's `base/` folder in WORKDIR:
  .venv/bin/python experiments/main.py --config=docs/results/val-tuning/more-rl/long_ppo.py:wide \
      --workdir=WORKDIR --config.seed=S
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[4]          # the repository
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]      # tr/ and experiments/terminal_rsi.py
import terminal_rsi  # noqa: E402  pylint: disable=wrong-import-position


def get_config(variant: str = "wide"):
    if variant not in ("wide", "matched"):
        raise ValueError(f"{__file__}: unknown variant {variant!r}; choose 'wide' or 'matched'")
    config = terminal_rsi.get_config("direct_ppo")
    config.stage_defaults.eval.update(count=64, every=2)
    config.report.split = "val"
    if variant == "wide":
        for entry in config.stages:          # direct_ppo runs the sum of RPR-1's and RPR-2's
            if entry["name"] in ("rpr1", "rpr2"):
                entry["rpr"]["iterations"] = 8
        config.stage_defaults.rollout.tasks_per_iteration = 32
        config.stage_defaults.arrays.rows = 64
    return config
