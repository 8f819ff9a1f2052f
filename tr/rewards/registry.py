"""Episode rewards by name: a new reward is one function + one registration.

    @register_reward("my_reward", scale_field="D")
    def my_reward(strict_pass, matched, scale):   # -> float32 [n]
        ...

`strict_pass` (float32 0/1) and `matched` (float32 check counts) are per episode; `scale` is the
family scale of each episode read from the frozen scale table's `scale_field` column (`D`,
`D_prime`: `tr.rewards.profile`), or None for a reward registered without one (it needs no table).
Stage configs name a reward (`rpr.reward`) and are checked against `rewards()`; the fixed-trajectory
rescoring (`tr.rewards.rescore`) scores with the same functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from tr.rewards import shaping

RewardFn = Callable[[Any, Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Reward:
    """A registered reward: its name, the scale-table column it reads (None: no table), `fn`."""

    name: str
    scale_field: str | None
    fn: RewardFn

    @property
    def needs_scales(self) -> bool:
        return self.scale_field is not None


_REWARDS: dict[str, Reward] = {}


def register_reward(name: str, *, scale_field: str | None = None) -> Callable[[RewardFn], RewardFn]:
    """Registers `fn(strict_pass, matched, scale) -> rewards` under `name`; `scale_field` is the
    scale-table column giving `scale` (None: the reward reads no table, `scale` is None)."""
    def register(fn: RewardFn) -> RewardFn:
        if name in _REWARDS:
            raise ValueError(f"reward {name!r} is already registered")
        _REWARDS[name] = Reward(name, scale_field, fn)
        return fn
    return register


def reward(name: str) -> Reward:
    if name not in _REWARDS:
        raise ValueError(f"reward {name!r} unknown; registered: {rewards()}")
    return _REWARDS[name]


def rewards() -> list[str]:
    """The registered reward names, sorted."""
    return sorted(_REWARDS)


def scaled_rewards() -> list[str]:
    """The registered rewards that read a family scale table (the rescoring formulas)."""
    return [name for name in rewards() if _REWARDS[name].needs_scales]


# ------------------------------------------------------------------------------------------------
# The built-in ones (SPEC §5).


@register_reward("strict")
def _strict(strict_pass, matched, scale):
    """S: 1 for a strict pass, else 0."""
    del matched, scale
    return np.asarray(strict_pass)


@register_reward("fdr", scale_field="D")
def _fdr(strict_pass, matched, scale):
    """Family dense reward max(P / D_f, 0)."""
    del strict_pass
    return np.asarray(shaping.fdr(matched, scale))


@register_reward("spr", scale_field="D_prime")
def _spr(strict_pass, matched, scale):
    """Strict-pass-dominant reward S + P⁺ / (P⁺ + D'_f)."""
    return np.asarray(shaping.spr(strict_pass, matched, scale))
