"""Dynamic sampling (tr/agent/dynamic_sampling.py): uniform groups are dropped and counted, the
first n groups with reward variance kept in order, uncounted episodes ignored."""

import pytest

from tr.agent.dynamic_sampling import has_signal, select_groups
from tr.agent.records import EpisodeRecord, EpisodeStatus


def _rec(group, i, passed, status=None):
    status = status or (EpisodeStatus.VERIFIED_PASS if passed else EpisodeStatus.VERIFIED_FAIL)
    return EpisodeRecord(episode_id=f"{group}-{i}", task_id=group, group_id=group,
                         rollout_index=i, passed=passed, status=status)


def _group(name, outcomes):
    return ("original", [_rec(name, i, p) for i, p in enumerate(outcomes)])


def test_uniform_groups_are_dropped_and_replaced_from_the_pool():
    groups = [_group("a", [1, 1, 1]), _group("b", [0, 1, 0]), _group("c", [0, 0, 0]),
              _group("d", [1, 0, 1]), _group("e", [0, 1, 1]), _group("f", [1, 0, 0])]
    kept, dropped = select_groups(groups, 3)
    # reference: walk the pool, keep the first 3 with both outcomes, count the uniform ones seen
    assert [recs[0].group_id for _, recs in kept] == ["b", "d", "e"]
    assert dropped == 2
    kept, dropped = select_groups(groups, 10)            # the pool runs short: a smaller batch
    assert [recs[0].group_id for _, recs in kept] == ["b", "d", "e", "f"] and dropped == 2


def test_an_uncounted_episode_does_not_make_a_group_informative():
    recs = [_rec("g", 0, True), _rec("g", 1, True),
            _rec("g", 2, None, EpisodeStatus.INFRA_FAILURE)]
    assert not has_signal(recs)
    assert has_signal(recs + [_rec("g", 3, False, EpisodeStatus.TURN_CAP)])


def test_negative_n_is_named():
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        select_groups([], -1)
