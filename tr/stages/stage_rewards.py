"""Per-episode rewards of a stage: the profiling columns of a record, the frozen family scale table,
and the registered reward (`tr.rewards.registry`) a config names."""

from __future__ import annotations

import pathlib
from typing import Sequence

import numpy as np

from tr.agent.records import EpisodeRecord
from tr.rewards import profile
from tr.rewards import registry as reward_registry
from tr.stages.registry import ConfigError


def trajectory_row(record: EpisodeRecord) -> dict:
    """`{family, matched, executed, strict_pass, turns}` of a record (the profiling columns)."""
    return {"family": record.family or "unknown", "matched": float(record.matched or 0.0),
            "executed": int(record.executed or 0), "strict_pass": bool(record.passed),
            "turns": record.num_turns}


def profile_scales(records: Sequence[EpisodeRecord], path: pathlib.Path, *,
                   quantile: float = 0.9, failure_threshold: float = 1.0) -> dict:
    """The family scale table of `records` (SPEC §5, recalibrated), written to `path`; read back
    unchanged when `path` exists (scales are frozen within a stage, also across a resume)."""
    if path.exists():
        return profile.load_scale_table(path)
    rows = [trajectory_row(r) for r in records if r.status.counts]
    if not rows:
        raise ConfigError(f"{path}: no counted profiling rollouts to build a scale table from")
    table = profile.build_scale_table(rows, quantile=quantile, failure_threshold=failure_threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(profile.dumps_scale_table(table))
    tmp.replace(path)
    return table


def episode_rewards(records: Sequence[EpisodeRecord], kind: str, scales: dict | None = None
                    ) -> np.ndarray:
    """Per-record rewards of the reward `kind` registers (`tr.rewards.registry`: `strict` S,
    `fdr` max(P/D_f, 0), `spr` S + P⁺/(P⁺ + D'_f)).

    A family missing from the table gets scale 1 (the floor of `D_f`).
    """
    reward = reward_kind(kind, "reward")
    rows = [trajectory_row(r) for r in records]
    strict = np.asarray([r["strict_pass"] for r in rows], np.float32)
    matched = np.asarray([r["matched"] for r in rows], np.float32)
    scale = None
    if reward.needs_scales:
        if scales is None:
            raise ConfigError(f"reward {kind!r} needs a family scale table")
        scale = np.asarray([float(scales.get(r["family"], {}).get(reward.scale_field, 1.0))
                            for r in rows], np.float32)
    return reward.fn(strict, matched, scale)


def reward_kind(kind: str, field: str) -> reward_registry.Reward:
    """The registered reward `kind` names; ConfigError naming the config `field` and the
    registered rewards otherwise."""
    if kind not in reward_registry.rewards():
        raise ConfigError(f"{field} = {kind!r}: expected one of {reward_registry.rewards()}")
    return reward_registry.reward(kind)
