"""Val Pass@1 (64 tasks, k = 1) per rollout episode of the `wide` and `matched` arms, one panel per
seed, from RUN_ROOT/seed-S/ARM/ppo/eval-val.jsonl (run from the repository root):
  .venv/bin/python docs/results/val-tuning/more-rl/plot.py RUN_ROOT"""
import json
import pathlib
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

import long_ppo  # noqa: E402  the arms' configs, beside this script


def episodes_per_iteration(arm: str) -> int:
    """Rollout episodes per iteration of `arm`: tasks_per_iteration x group_size of its config."""
    rollout = long_ppo.get_config(arm).stage_defaults.rollout
    return int(rollout.tasks_per_iteration) * int(rollout.group_size)


def curve(path: pathlib.Path, per_iteration: int) -> tuple[list[int], list[float]]:
    """(rollout episodes before each evaluation, val pass@1) from a stage's eval-val.jsonl."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # `iteration` is the 0-based index of the last finished iteration (step 0: none finished)
    return ([(line["iteration"] + 1) * per_iteration if line["step"] else 0 for line in lines],
            [100 * line["pass@1"] for line in lines])


def main(root: pathlib.Path) -> None:
    seeds = sorted(p for p in root.glob("seed-*") if p.is_dir())
    if not seeds:
        raise SystemExit(f"{root}: no seed-*/ folders")
    fig, axes = plt.subplots(1, len(seeds), figsize=(5 * len(seeds), 3.6), squeeze=False)
    for ax, seed_dir in zip(axes[0], seeds):
        for arm in ("wide", "matched"):
            per_iteration = episodes_per_iteration(arm)
            path = seed_dir / arm / "ppo" / "eval-val.jsonl"
            if path.exists():
                ax.plot(*curve(path, per_iteration), marker="o", label=f"{arm} ({per_iteration}/batch)")
        ax.set(title=seed_dir.name, xlabel="rollout episodes", ylabel="val Pass@1 (%, 64 tasks)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = pathlib.Path(__file__).with_name("val-curves.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "."))
