"""Dynamic sampling (DAPO): keep the rollout groups that carry a GRPO gradient.

A group whose counted rollouts all pass or all fail has reward variance 0, so its group-normalised
advantages are 0 and it adds no gradient; it still counts as a group in the update's weighting
(`tr.rl.losses.reterm_token_weights`), diluting the groups that do. DAPO samples more groups than
the batch needs and keeps the first ones with variance: here the caller rolls out `n + extra`
groups (the oversampling pool) and `select_groups` keeps the first `n` with variance, in order,
dropping the uniform ones (counted: `groups_dropped_uniform`). If the pool holds fewer than `n`
such groups the batch is smaller (the update's padding rows carry no group).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["has_signal", "select_groups"]


def has_signal(records: Sequence) -> bool:
    """Whether the group's counted rollouts (`EpisodeStatus.counts`) disagree on `passed`."""
    outcomes = {bool(r.passed) for r in records if r.status.counts}
    return len(outcomes) > 1


def select_groups(groups: Sequence[tuple[str, Sequence]], n: int) -> tuple[list, int]:
    """The first `n` groups (`(kind, records)`) with reward variance, in order, and how many
    uniform groups were dropped (all pass or all fail). Groups past the first `n` with variance
    are left over (neither kept nor counted as dropped)."""
    if n < 0:
        raise ValueError(f"select_groups: n must be >= 0, got {n}")
    kept, dropped = [], 0
    for kind, recs in groups:
        if len(kept) == n:
            break
        if has_signal(recs):
            kept.append((kind, recs))
        else:
            dropped += 1
    return kept, dropped
