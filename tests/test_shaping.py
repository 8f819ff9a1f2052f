"""SPEC.md §5 reward properties, proved over random inputs (hypothesis) and against references."""

import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tr.rewards import shaping

SETTINGS = settings(max_examples=60, deadline=None)

# P covers negative penalties, everyday counts and float32-breaking magnitudes; D' covers D/2..2D.
matched_values = st.one_of(
    st.integers(-50, 200).map(float),
    st.floats(-1e3, 1e3, allow_nan=False, width=32),
    st.floats(1e6, 1e30, allow_nan=False).map(lambda x: float(np.float32(x))),
)
scale_values = st.floats(0.5, 1e3, allow_nan=False, width=32)
matched_arrays = st.lists(matched_values, min_size=24, max_size=24)  # one shape: one compile


def linear_quantile(values, q):
    """Reference: numpy's default 'linear' quantile, written out (Hyndman & Fan type 7)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


# ---------------------------------------------------------------- family scales


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.integers(-5, 40)), min_size=1, max_size=60
    ),
    st.sampled_from([0.5, 0.75, 0.9, 1.0]),
)
def test_family_scales_match_linear_quantile_with_floor_of_one(rows, quantile):
    families = [f for f, _ in rows]
    matched = [m for _, m in rows]
    scales = shaping.family_scales(families, matched, quantile)
    assert set(scales) == set(families)
    for family, scale in scales.items():
        counts = [m for f, m in rows if f == family]
        expected = max(1.0, linear_quantile(counts, quantile))
        assert scale == pytest.approx(expected, rel=1e-12, abs=1e-12)
        assert scale == pytest.approx(max(1.0, float(np.quantile(counts, quantile))))
        assert scale >= 1.0
        assert isinstance(scale, float)


def test_family_scale_is_the_interpolated_090_quantile():
    families = ["a"] * 11 + ["b"] * 4
    matched = list(range(11)) + [0, 0, 1, 0]
    scales = shaping.family_scales(families, matched)
    assert scales["a"] == pytest.approx(9.0)  # position 0.9 * 10 = 9 exactly
    assert scales["b"] == 1.0  # Q = 0.7 is floored to 1


def test_family_scales_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 families but 3"):
        shaping.family_scales(["a", "b"], [1, 2, 3])


# ---------------------------------------------------------------- FDR


@SETTINGS
@given(matched_arrays, scale_values)
def test_fdr_is_clipped_ratio(matched, scale):
    reward = shaping.fdr(np.asarray(matched, np.float32), scale)
    assert reward.dtype == jnp.float32
    p32 = np.asarray(matched, np.float32)
    expected = [max(float(np.float32(p / np.float32(scale))), 0.0) for p in p32]
    # atol: XLA on CPU flushes float32 subnormals (|x| < 1.2e-38) to zero.
    np.testing.assert_allclose(np.asarray(reward), expected, rtol=1e-6, atol=1e-37)
    assert np.all(np.asarray(reward) >= 0.0)


def test_fdr_lets_failures_reach_one_and_is_jittable():
    matched = jnp.array([0, 3, 6, -2, 12], dtype=jnp.int32)
    reward = jax.jit(shaping.fdr)(matched, 6.0)
    assert reward.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(reward), [0.0, 0.5, 1.0, 0.0, 2.0])


# ---------------------------------------------------------------- SPR


@SETTINGS
@given(matched_arrays, scale_values)
def test_every_failure_below_one_every_success_at_least_one_and_below_two(matched, scale):
    matched = np.asarray(matched, np.float32)
    failures = np.asarray(shaping.spr(np.zeros(matched.shape, bool), matched, scale))
    successes = np.asarray(shaping.spr(np.ones(matched.shape, bool), matched, scale))
    assert failures.dtype == np.float32 and successes.dtype == np.float32
    assert np.all(failures >= 0.0) and np.all(failures < 1.0)
    assert np.all(successes >= 1.0) and np.all(successes < 2.0)


@SETTINGS
@given(matched_arrays, scale_values)
def test_success_beats_failure_with_equal_matched_by_exactly_one(matched, scale):
    matched = np.asarray(matched, np.float32)
    failures = shaping.spr(np.zeros(matched.shape, bool), matched, scale)
    successes = shaping.spr(np.ones(matched.shape, bool), matched, scale)
    np.testing.assert_allclose(np.asarray(successes - failures), 1.0, rtol=0, atol=1.2e-7)


@SETTINGS
@given(matched_arrays, st.lists(st.booleans(), min_size=40, max_size=40), scale_values)
def test_spr_matches_float64_reference(matched, passes, scale):
    strict = np.asarray(passes[: len(matched)], bool)
    reward = np.asarray(shaping.spr(strict, np.asarray(matched, np.float32), scale))
    for s, p, r in zip(strict, np.asarray(matched, np.float32), reward):
        positive = max(float(p), 0.0)
        expected = float(s) + positive / (positive + float(np.float32(scale)))
        assert r == pytest.approx(expected, rel=2e-7, abs=2e-7)


@SETTINGS
@given(
    st.floats(0.0, 1e4, allow_nan=False, width=32),
    st.floats(0.0, 1e4, allow_nan=False, width=32),
    scale_values,
)
def test_progress_term_is_monotone_and_midpoint_concave(a, b, scale):
    low, high = min(a, b), max(a, b)
    g = lambda p: float(shaping.progress(np.float32(p), scale))  # noqa: E731
    assert g(low) <= g(high)
    midpoint = float(np.float32((low + high) / 2))
    assert g(midpoint) >= (g(low) + g(high)) / 2 - 1e-6


progress_slope = jax.jit(jax.grad(shaping.progress))
progress_curvature = jax.jit(jax.grad(jax.grad(shaping.progress)))


@SETTINGS
@given(st.floats(0.0625, 1e3, width=32), st.floats(0.5, 100, width=32))
def test_progress_derivatives_are_positive_then_negative(p, scale):
    first = float(progress_slope(jnp.float32(p), jnp.float32(scale)))
    second = float(progress_curvature(jnp.float32(p), jnp.float32(scale)))
    d = float(np.float32(scale))
    assert first > 0 and first == pytest.approx(d / (p + d) ** 2, rel=5e-3)
    assert second < 0 and second == pytest.approx(-2 * d / (p + d) ** 3, rel=5e-2)


def test_spr_bounds_survive_float32_rounding_at_huge_matched_counts():
    # P / (P + D') rounds to 1.0 in float32 here; the bounds must still be strict.
    matched = np.float32([1e8, 3e38])
    assert float(np.float32(1e8) / (np.float32(1e8) + np.float32(1.0))) == 1.0
    failures = np.asarray(shaping.spr([False, False], matched, 1.0))
    successes = np.asarray(shaping.spr([True, True], matched, 1.0))
    assert np.all(failures < 1.0) and np.all(successes < 2.0)
    np.testing.assert_array_equal(successes - failures, [1.0, 1.0])


def test_spr_negative_progress_is_clipped_and_inputs_are_cast_to_float32():
    reward = jax.jit(shaping.spr)(
        jnp.array([1, 0, 1, 0], jnp.int32), jnp.array([-3, -3, 2, 2], jnp.int32), 2.0
    )
    assert reward.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(reward), [1.0, 0.0, 1.5, 0.5])


# ---------------------------------------------------------------- recalibration


def reference_rules(families, matched, strict_pass, turns, scales, threshold):
    """Rules written the obvious way, one family at a time."""
    names = sorted(set(families))
    rows = {f: [] for f in names}
    for f, p, s, t in zip(families, matched, strict_pass, turns):
        rows[f].append((max(float(np.float32(p) / np.float32(scales[f])), 0.0), s, t))
    mean_turns = {f: sum(t for _, _, t in rows[f]) / len(rows[f]) for f in names}
    mean_reward = {f: sum(r for r, _, _ in rows[f]) / len(rows[f]) for f in names}
    median_turns = statistics.median(mean_turns.values())
    median_reward = statistics.median(mean_reward.values())
    rules = {}
    for f in names:
        if any(not s and r >= threshold for r, s, _ in rows[f]):
            rules[f] = "failure_suppression"
        elif mean_turns[f] > median_turns and mean_reward[f] < median_reward:
            rules[f] = "long_low_reward"
        else:
            rules[f] = "none"
    return rules


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcdef"),
            st.integers(-3, 12),
            st.booleans(),
            st.integers(1, 40),
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([0.8, 1.0, 1.25]),
)
def test_recalibration_matches_reference_rules(rows, threshold):
    families, matched, strict_pass, turns = (list(c) for c in zip(*rows))
    scales = shaping.family_scales(families, matched)
    profile = shaping.Trajectories(
        tuple(families), np.float32(matched), np.asarray(strict_pass), np.int32(turns)
    )
    expected = reference_rules(families, matched, strict_pass, turns, scales, threshold)
    rules = shaping.recalibration_rules(profile, scales, failure_threshold=threshold)
    assert rules == expected
    primes = shaping.recalibrate(profile, scales, failure_threshold=threshold)
    factor = {"failure_suppression": 2.0, "long_low_reward": 0.5, "none": 1.0}
    assert primes == {f: scales[f] * factor[expected[f]] for f in scales}


def priority_profile():
    """a: long, low reward, and one failure at R_FDR = 1; b: short, high; c: the medians."""
    rows = (
        [("a", 10, False, 100)] + [("a", 0, False, 100)] * 3
        + [("b", 8, True, 10)] * 4
        + [("c", 5, True, 50)] * 4
    )
    families, matched, strict_pass, turns = (list(c) for c in zip(*rows))
    return {"families": families, "matched": matched, "strict_pass": strict_pass, "turns": turns}


def test_failure_suppression_wins_over_long_low_reward():
    scales = {"a": 10.0, "b": 10.0, "c": 10.0}
    profile = priority_profile()
    assert shaping.recalibration_rules(profile, scales) == {
        "a": "failure_suppression", "b": "none", "c": "none"
    }
    assert shaping.recalibrate(profile, scales) == {"a": 20.0, "b": 10.0, "c": 10.0}


def test_long_low_reward_halves_when_no_failure_reaches_the_threshold():
    scales = {"a": 10.0, "b": 10.0, "c": 10.0}
    profile = priority_profile()
    rules = shaping.recalibration_rules(profile, scales, failure_threshold=1.5)
    assert rules == {"a": "long_low_reward", "b": "none", "c": "none"}
    assert shaping.recalibrate(profile, scales, failure_threshold=1.5) == {
        "a": 5.0, "b": 10.0, "c": 10.0
    }
    custom = shaping.recalibrate(
        profile, scales, failure_threshold=0.9, suppression_factor=3.0, long_low_factor=0.25
    )
    assert custom == {"a": 30.0, "b": 10.0, "c": 10.0}


def test_a_successful_trajectory_never_triggers_failure_suppression():
    scales = {"a": 2.0}
    profile = {"families": ["a", "a"], "matched": [9, 0], "strict_pass": [True, False],
               "turns": [3, 3]}
    assert shaping.recalibrate(profile, scales) == {"a": 2.0}


def test_recalibrate_accepts_per_trajectory_records_and_rejects_unknown_families():
    rows = [{"family": "a", "matched": 4, "strict_pass": False, "turns": [1, 2]},
            {"family": "b", "matched": 1, "strict_pass": True, "turns": 2}]
    assert shaping.recalibrate(rows, {"a": 4.0, "b": 1.0}) == {"a": 8.0, "b": 1.0}
    with pytest.raises(ValueError, match="no scale for family"):
        shaping.recalibrate(rows, {"a": 4.0})
