"""Fixed-trajectory rescoring: the same trajectories and outcome labels, only the formula changes.

For each formula (FDR with ``D_f``, SPR with ``D'_f``; SPEC.md §5) it reports

* ``failure_mass_share``: ``Σ_failures R / Σ_all R`` (None when the total mass is 0)
* ``failures_ge_1``: failures with ``R ≥ 1``
* ``all_checks_failures``: failures with ``matched == executed > 0``, i.e. that passed every
  executed check (and had no penalty) yet missed the strict gate; independent of the formula. A
  failure that executed no check (e.g. the verifier could not run) is not counted: passing zero
  checks is not "passing every check"
* ``mean_success``, ``mean_failure`` (None for an empty group), ``n_success``, ``n_failure``

Scales come from the same files (a profiling pass: ``D`` by `shaping.family_scales`, ``D'`` by
`shaping.recalibrate`, i.e. `profile.build_scale_table`) or from ``--scales`` (the JSON written by
``python -m tr.rewards.profile``). Input lines are described in `tr.rewards.profile`.

Command::

    python -m tr.rewards.rescore FILE.jsonl [FILE ...] [--scales scales.json]
        [--formula fdr|spr|both] [--json] [--plot OUT.png] [--skip-bad]

Exit status 0 on success, 2 on bad input (the message names the file and line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tr.rewards import profile, registry, shaping

# the registered rewards that read a scale table (`tr.rewards.registry`): fdr, spr
FORMULAS = tuple(registry.scaled_rewards())
METRIC_KEYS = (
    "failure_mass_share",
    "failures_ge_1",
    "all_checks_failures",
    "mean_success",
    "mean_failure",
    "n_success",
    "n_failure",
)


def formula_rewards(
    trajectories: shaping.Trajectories, table: Mapping[str, Mapping[str, Any]], formula: str
) -> np.ndarray:
    """Per-trajectory float32 rewards of one formula under a scale table (``D`` / ``D_prime``)."""
    missing = sorted(set(trajectories.families) - set(table))
    if missing:
        raise KeyError(f"no scale for family/families {missing}")
    if formula not in FORMULAS:
        raise ValueError(f"unknown formula {formula!r}; expected one of {FORMULAS}")
    kind = registry.reward(formula)
    scale = np.asarray([table[f][kind.scale_field] for f in trajectories.families], np.float32)
    return kind.fn(trajectories.strict_pass, trajectories.matched, scale)


def reward_metrics(
    rewards: np.ndarray, strict_pass: np.ndarray, matched: np.ndarray, executed: np.ndarray
) -> dict[str, Any]:
    """The rescoring report of one formula over fixed outcome labels (see module docstring)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    success = np.asarray(strict_pass, dtype=bool)
    failure = ~success
    total = rewards.sum()
    executed = np.asarray(executed, np.float64)
    all_checks = (np.asarray(matched, np.float64) == executed) & (executed > 0)
    return {
        "failure_mass_share": float(rewards[failure].sum() / total) if total > 0 else None,
        "failures_ge_1": int((rewards[failure] >= 1.0).sum()),
        "all_checks_failures": int((failure & all_checks).sum()),
        "mean_success": float(rewards[success].mean()) if success.any() else None,
        "mean_failure": float(rewards[failure].mean()) if failure.any() else None,
        "n_success": int(success.sum()),
        "n_failure": int(failure.sum()),
    }


def rescore(
    trajectories: shaping.Trajectories,
    table: Mapping[str, Mapping[str, Any]],
    formulas: Sequence[str] = FORMULAS,
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """Metrics and per-trajectory rewards for each formula."""
    if trajectories.executed is None:
        raise ValueError("rescore: trajectories need 'executed' counts")
    rewards = {f: formula_rewards(trajectories, table, f) for f in formulas}
    metrics = {
        f: reward_metrics(
            r, trajectories.strict_pass, trajectories.matched, trajectories.executed
        )
        for f, r in rewards.items()
    }
    return metrics, rewards


def format_metrics(metrics: Mapping[str, Mapping[str, Any]]) -> str:
    """A table with one column per formula."""

    def cell(key: str, value: Any) -> str:
        if value is None:
            return "n/a"
        if key == "failure_mass_share":
            return f"{100 * value:.2f}%"
        if isinstance(value, float):
            return f"{value:.4f}"
        return str(value)

    formulas = list(metrics)
    lines = [f"{'metric':<22}" + "".join(f"{f.upper():>12}" for f in formulas)]
    lines.append("-" * len(lines[0]))
    for key in METRIC_KEYS:
        lines.append(
            f"{key:<22}" + "".join(f"{cell(key, metrics[f][key]):>12}" for f in formulas)
        )
    return "\n".join(lines)


def plot_rewards(
    rewards: Mapping[str, np.ndarray],
    strict_pass: np.ndarray,
    metrics: Mapping[str, Mapping[str, Any]],
    path: str,
) -> None:
    """Histograms of success and failure rewards, one panel per formula, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    success = np.asarray(strict_pass, dtype=bool)
    figure, axes = plt.subplots(
        1, len(rewards), figsize=(6 * len(rewards), 4.2), squeeze=False, constrained_layout=True
    )
    for axis, (formula, values) in zip(axes[0], rewards.items()):
        top = max(2.0, float(np.max(values)) if values.size else 2.0)
        bins = np.linspace(0.0, top, 41)
        axis.hist(values[success], bins=bins, alpha=0.6, color="tab:green",
                  label=f"successes (n={int(success.sum())})")
        axis.hist(values[~success], bins=bins, alpha=0.6, color="tab:red",
                  label=f"failures (n={int((~success).sum())})")
        axis.axvline(1.0, color="black", linestyle="--", linewidth=1, label="R = 1")
        share = metrics[formula]["failure_mass_share"]
        share_text = "n/a" if share is None else f"{100 * share:.1f}%"
        axis.set_title(
            f"{formula.upper()}: failure mass {share_text}, "
            f"failures R≥1: {metrics[formula]['failures_ge_1']}"
        )
        axis.set_xlabel("reward")
        axis.set_ylabel("trajectories")
        axis.legend(loc="upper right")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tr.rewards.rescore",
        description="Rescore fixed trajectories under FDR and SPR (SPEC.md §5).",
    )
    parser.add_argument("files", nargs="+", help="JSONL trajectory files")
    parser.add_argument(
        "--scales", help="scale table from `python -m tr.rewards.profile` (default: profile FILEs)"
    )
    parser.add_argument("--formula", choices=(*FORMULAS, "both"), default="both")
    parser.add_argument("--json", action="store_true", help='print {"fdr": {...}, "spr": {...}}')
    parser.add_argument("--plot", metavar="OUT.png", help="write reward histograms here")
    parser.add_argument("--skip-bad", action="store_true", help="report and skip bad lines")
    args = parser.parse_args(argv)
    formulas = FORMULAS if args.formula == "both" else (args.formula,)
    try:
        trajectories, bad = profile.read_trajectories(args.files, skip_bad=args.skip_bad)
        table = (
            profile.load_scale_table(args.scales)
            if args.scales
            else profile.build_scale_table(trajectories)
        )
    except profile.TrajectoryInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for line in bad:
        print(f"{'excluded' if line.excluded else 'skipped'} {line}", file=sys.stderr)
    try:
        metrics, rewards = rescore(trajectories, table, formulas)
    except KeyError as error:
        print(f"error: {args.scales}: {error.args[0]}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
    else:
        source = args.scales or "profiled from the input"
        print(f"{len(trajectories.families)} trajectories, scales: {source}")
        print(format_metrics(metrics))
    if args.plot:
        plot_rewards(rewards, trajectories.strict_pass, metrics, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
