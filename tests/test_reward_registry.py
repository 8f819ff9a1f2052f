"""Rewards by name (`tr.rewards.registry`): each built-in reward equals its SPEC §5 formula written
out in numpy, a stage's per-episode rewards read the registry's scale column, and a config naming an
unregistered reward is refused with the field and the registered names."""

import numpy as np
import pytest

from tr.agent.records import EpisodeRecord, EpisodeStatus
from tr.rewards import registry, rescore
from tr.stages import rpr
from tr.stages.stage_config import resolve_stage_config
from tr.stages.stage_rewards import episode_rewards
from tr.stages.registry import ConfigError

STRICT = np.asarray([1, 0, 0, 1, 0], np.float32)
MATCHED = np.asarray([3, 2, 0, 7, 5], np.float32)
SCALE = np.asarray([4, 2, 1, 3, 10], np.float32)


def reference(name, strict, matched, scale):
    if name == "strict":
        return strict
    if name == "fdr":
        return np.maximum(matched / scale, 0.0)
    positive = np.maximum(matched, 0.0)
    return strict + positive / (positive + scale)


def test_the_built_in_rewards_are_registered_with_their_scale_columns():
    assert registry.rewards() == ["fdr", "spr", "strict"]
    assert {n: registry.reward(n).scale_field for n in registry.rewards()} == {
        "fdr": "D", "spr": "D_prime", "strict": None}
    assert registry.scaled_rewards() == ["fdr", "spr"] == list(rescore.FORMULAS)


@pytest.mark.parametrize("name", ["strict", "fdr", "spr"])
def test_each_reward_is_its_formula(name):
    kind = registry.reward(name)
    got = kind.fn(STRICT, MATCHED, SCALE if kind.needs_scales else None)
    np.testing.assert_allclose(got, reference(name, STRICT, MATCHED, SCALE), rtol=1e-6)
    assert np.asarray(got).dtype == np.float32


def test_unknown_and_duplicate_names_are_refused():
    with pytest.raises(ValueError, match=r"reward 'dense' unknown; registered: \['fdr', 'spr', 'strict'\]"):
        registry.reward("dense")
    with pytest.raises(ValueError, match="'fdr' is already registered"):
        registry.register_reward("fdr")(lambda s, m, d: s)


def record(i, family, passed, matched):
    return EpisodeRecord(episode_id=f"e{i}", task_id=f"t{i}", family=family, passed=passed,
                         matched=matched, executed=8,
                         status=EpisodeStatus.VERIFIED_PASS if passed else EpisodeStatus.VERIFIED_FAIL)


def test_episode_rewards_read_the_scale_column_of_the_record_family():
    records = [record(0, "a", True, 3.0), record(1, "b", False, 2.0), record(2, "z", False, 5.0)]
    scales = {"a": {"D": 4.0, "D_prime": 2.0}, "b": {"D": 2.0, "D_prime": 8.0}}
    strict = np.asarray([1, 0, 0], np.float32)
    matched = np.asarray([3, 2, 5], np.float32)
    # family z is not in the table: scale 1
    for name, scale in (("strict", None), ("fdr", [4, 2, 1]), ("spr", [2, 8, 1])):
        want = reference(name, strict, matched, np.asarray(scale or [1, 1, 1], np.float32))
        np.testing.assert_allclose(episode_rewards(records, name, scales), want, rtol=1e-6)
    with pytest.raises(ConfigError, match="'fdr' needs a family scale table"):
        episode_rewards(records, "fdr")


def test_a_stage_naming_an_unregistered_reward_is_refused_naming_the_field(tmp_path):
    config = resolve_stage_config({"name": "r", "rpr": {"reward": "dense"}}, rpr.defaults())
    with pytest.raises(ConfigError, match=r"stage 'r': rpr.reward = 'dense': expected one of "
                                          r"\['fdr', 'spr', 'strict'\]"):
        rpr.run(config, tmp_path)
