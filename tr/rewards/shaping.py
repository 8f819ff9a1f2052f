"""Reward shaping for terminal agents (SPEC.md §5): family scales, FDR, SPR, recalibration.

A verifier gives each trajectory a matched count ``P`` (checks passed minus penalty units, may be
negative) and a strict pass ``S ∈ {0, 1}``. Tasks belong to families ``f``.

* family scale    ``D_f = max(1, Q_q(N | f))``, numpy's default (linear) quantile, ``q = 0.90``
* FDR             ``R_FDR = max(P / D_f, 0)``
* SPR             ``R_SPR = S + g(P⁺)``, ``g(P) = P / (P + D'_f)``, ``P⁺ = max(P, 0)``
* recalibration   ``D_f → D'_f``: failure suppression (``2 D``) beats long-low-reward (``D / 2``)

``fdr`` and ``spr`` are pure ``jnp`` functions (jit-able, float32). ``family_scales`` and
``recalibrate`` work on host data (family names are strings) and return plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import chex
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Num

# Rule names reported per family by `recalibration_rules` (and written by the profile command).
RULE_FAILURE_SUPPRESSION = "failure_suppression"
RULE_LONG_LOW_REWARD = "long_low_reward"
RULE_NONE = "none"
RULES = (RULE_FAILURE_SUPPRESSION, RULE_LONG_LOW_REWARD, RULE_NONE)

# Largest float32 g with 1 + g < 2 exactly representable: 1 - 2**-23. In exact arithmetic
# g(P) < 1 always; in float32, P / (P + D') rounds to 1.0 once P > ~1e7 D', which would give a
# failure a reward of 1 and a success a reward of 2. Clamping g here keeps both bounds strict.
_PROGRESS_SUP = np.float32(1.0 - 2.0**-23)


class Trajectories(NamedTuple):
    """Per-trajectory columns of a profiling run (the ``profile`` of ``recalibrate``).

    families: family name of each trajectory (host strings)
    matched: ``P``, float32 [n]
    strict_pass: ``S``, bool [n]
    turns: number of turns, int32 [n]
    executed: number of checks executed, int32 [n] (not needed by the rules; carried for reports)
    """

    families: tuple[str, ...]
    matched: np.ndarray
    strict_pass: np.ndarray
    turns: np.ndarray
    executed: np.ndarray | None = None


def as_trajectories(profile: Any) -> Trajectories:
    """Coerce a profile into `Trajectories`.

    Accepts a `Trajectories`, any object or mapping with ``families`` (or ``family``), ``matched``,
    ``strict_pass``, ``turns`` (optionally ``executed``), or a sequence of per-trajectory mappings
    with ``family``, ``matched``, ``strict_pass``, ``turns``.
    """
    if isinstance(profile, Trajectories):
        columns = profile._asdict()
    elif isinstance(profile, Mapping):
        columns = dict(profile)
    elif isinstance(profile, Sequence) and not isinstance(profile, (str, bytes)):
        rows = list(profile)
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("profile: a sequence profile must hold one mapping per trajectory")
        columns = {
            key: [r[key] for r in rows] for key in ("family", "matched", "strict_pass", "turns")
        }
        if rows and all("executed" in r for r in rows):
            columns["executed"] = [r["executed"] for r in rows]
    else:
        columns = {
            k: getattr(profile, k)
            for k in ("families", "family", "matched", "strict_pass", "turns", "executed")
            if hasattr(profile, k)
        }
    if "families" not in columns and "family" in columns:
        columns["families"] = columns["family"]
    missing = [k for k in ("families", "matched", "strict_pass", "turns") if k not in columns]
    if missing:
        raise ValueError(f"profile: missing column(s) {missing}")
    families = tuple(str(f) for f in columns["families"])
    matched = np.asarray(columns["matched"], dtype=np.float32).reshape(-1)
    strict_pass = np.asarray(columns["strict_pass"]).astype(bool).reshape(-1)
    turns_in = columns["turns"]
    turns = np.asarray(
        [len(t) if isinstance(t, (list, tuple)) else t for t in turns_in], dtype=np.int32
    ).reshape(-1)
    executed = columns.get("executed")
    if executed is not None:
        executed = np.asarray(executed, dtype=np.int32).reshape(-1)
    n = len(families)
    for name, column in (("matched", matched), ("strict_pass", strict_pass), ("turns", turns)):
        if column.shape[0] != n:
            raise ValueError(f"profile: {name} has {column.shape[0]} entries, families has {n}")
    if executed is not None and executed.shape[0] != n:
        raise ValueError(f"profile: executed has {executed.shape[0]} entries, families has {n}")
    return Trajectories(families, matched, strict_pass, turns, executed)


def family_scales(
    families: Sequence[str], matched: ArrayLike, quantile: float = 0.9
) -> dict[str, float]:
    """``D_f = max(1, Q_q(N | f))`` for every family in ``families``.

    ``Q_q`` is numpy's default (linear-interpolation) quantile of the matched counts ``N`` of the
    trajectories of family ``f``. The floor of 1 keeps families that rarely pass any check from
    inflating small partial progress.
    """
    families = [str(f) for f in families]
    matched = np.asarray(matched, dtype=np.float64).reshape(-1)
    if matched.shape[0] != len(families):
        raise ValueError(
            f"family_scales: {len(families)} families but {matched.shape[0]} matched counts"
        )
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"family_scales: quantile must be in [0, 1], got {quantile}")
    if not np.all(np.isfinite(matched)):
        raise ValueError("family_scales: matched counts must be finite")
    names = np.asarray(families, dtype=object)
    return {
        f: float(max(1.0, np.quantile(matched[names == f], quantile)))
        for f in sorted(set(families))
    }


def fdr(
    matched: Num[ArrayLike, "*batch"], scale: Num[ArrayLike, "*batch"]
) -> Float[Array, "*batch"]:
    """Family dense reward ``R_FDR = max(P / D, 0)`` (float32; ``scale`` > 0 broadcasts)."""
    matched = jnp.asarray(matched, dtype=jnp.float32)
    scale = jnp.asarray(scale, dtype=jnp.float32)
    reward = jnp.maximum(matched / scale, jnp.float32(0.0))
    chex.assert_type(reward, jnp.float32)
    return reward


def progress(
    matched: Num[ArrayLike, "*batch"], scale: Num[ArrayLike, "*batch"]
) -> Float[Array, "*batch"]:
    """SPR progress term ``g(P) = P⁺ / (P⁺ + D')`` in ``[0, 1)``, increasing and concave in ``P⁺``.

    ``g'(P) = D' / (P + D')² > 0`` and ``g''(P) = -2 D' / (P + D')³ < 0``. Clamped to
    ``1 - 2⁻²³`` so the strict bound survives float32 rounding for astronomically large ``P``.
    """
    matched = jnp.asarray(matched, dtype=jnp.float32)
    scale = jnp.asarray(scale, dtype=jnp.float32)
    positive = jnp.maximum(matched, jnp.float32(0.0))
    return jnp.minimum(positive / (positive + scale), _PROGRESS_SUP)


def spr(
    strict_pass: Bool[ArrayLike, "*batch"] | Num[ArrayLike, "*batch"],
    matched: Num[ArrayLike, "*batch"],
    scale: Num[ArrayLike, "*batch"],
) -> Float[Array, "*batch"]:
    """Strict-pass-dominant reward ``R_SPR = S + P⁺ / (P⁺ + D')`` (float32).

    Every failure scores in ``[0, 1)``, every success in ``[1, 2)``, and a success beats a failure
    with the same ``P`` by exactly 1: partial credit cannot outweigh the strict gate.
    """
    strict = jnp.asarray(strict_pass).astype(jnp.float32)
    reward = strict + progress(matched, scale)
    chex.assert_type(reward, jnp.float32)
    return reward


def _family_columns(
    trajectories: Trajectories, scales: Mapping[str, float]
) -> tuple[list[str], np.ndarray]:
    families = sorted(set(trajectories.families))
    unknown = [f for f in families if f not in scales]
    if unknown:
        raise ValueError(f"recalibrate: no scale for family/families {unknown}")
    index = {f: i for i, f in enumerate(families)}
    codes = np.asarray([index[f] for f in trajectories.families], dtype=np.int64)
    return families, codes


def recalibration_rules(
    profile: Any,
    scales: Mapping[str, float],
    failure_threshold: float = 1.0,
) -> dict[str, str]:
    """The rule that fires for each family of the profile, with failure suppression first.

    * ``failure_suppression``: some failure (``S = 0``) of the family has ``R_FDR ≥
      failure_threshold`` under the family's scale ``D``.
    * ``long_low_reward``: the family's mean turns is strictly above the suite median and its
      mean ``R_FDR`` strictly below the suite median, the medians taken over the per-family means
      of the profiled families.
    * ``none`` otherwise. A family in ``scales`` but absent from the profile gets ``none``.
    """
    trajectories = as_trajectories(profile)
    rules = {str(f): RULE_NONE for f in scales}
    if not trajectories.families:
        return rules
    families, codes = _family_columns(trajectories, scales)
    scale_per_trajectory = np.asarray([scales[f] for f in families], dtype=np.float32)[codes]
    reward = np.asarray(fdr(trajectories.matched, scale_per_trajectory))
    counts = np.bincount(codes, minlength=len(families)).astype(np.float64)
    mean_turns = np.bincount(codes, weights=trajectories.turns, minlength=len(families)) / counts
    mean_reward = np.bincount(codes, weights=reward, minlength=len(families)) / counts
    failure = ~trajectories.strict_pass
    high_failure = np.zeros(len(families), dtype=bool)
    np.logical_or.at(high_failure, codes[failure], reward[failure] >= failure_threshold)
    long_low = (mean_turns > np.median(mean_turns)) & (mean_reward < np.median(mean_reward))
    for i, family in enumerate(families):
        if high_failure[i]:
            rules[family] = RULE_FAILURE_SUPPRESSION
        elif long_low[i]:
            rules[family] = RULE_LONG_LOW_REWARD
        else:
            rules[family] = RULE_NONE
    return rules


def recalibrate(
    profile: Any,
    scales: Mapping[str, float],
    failure_threshold: float = 1.0,
    suppression_factor: float = 2.0,
    long_low_factor: float = 0.5,
) -> dict[str, float]:
    """``D_f → D'_f`` from a profiling run (SPEC.md §5); rules as in `recalibration_rules`.

    ``D' = suppression_factor · D`` (default ``2 D``) under failure suppression,
    ``D' = long_low_factor · D`` (default ``D / 2``) for a long, low-reward family, else ``D``.
    ``profile`` is anything `as_trajectories` accepts (per-trajectory families, matched,
    strict_pass, turns); ``scales`` maps family → ``D``.
    """
    factor = {
        RULE_FAILURE_SUPPRESSION: suppression_factor,
        RULE_LONG_LOW_REWARD: long_low_factor,
        RULE_NONE: 1.0,
    }
    rules = recalibration_rules(profile, scales, failure_threshold=failure_threshold)
    return {f: float(scales[f]) * factor[rules[f]] for f in sorted(rules)}
