"""grain pipeline over episode shards: padding and packing checked against the per-episode arrays."""

import numpy as np
import pytest

from tr.agent.records import (
    EpisodeRecord, EpisodeStatus, Segment, episode_to_sequences, pad_sequences, write_shard,
)
from tr.data.episodes import BATCH_FIELDS, EpisodeShardSource, batch_dataset, sequence_dataset


def _episode(i: int, n_turns: int, status=EpisodeStatus.VERIFIED_PASS) -> EpisodeRecord:
    rng = np.random.default_rng(i)
    segs = [Segment("prompt", rng.integers(1, 200, 3).tolist(), turn=0)]
    for t in range(1, n_turns + 1):
        a = rng.integers(1, 200, 1 + t % 3).tolist()
        segs.append(Segment("action", a, turn=t, source="policy", logprobs=(-rng.random(len(a))).tolist()))
        segs.append(Segment("observation", rng.integers(1, 200, 2).tolist(), turn=t))
    return EpisodeRecord(episode_id=f"e{i}", task_id=f"t{i % 2}", status=status, passed=i % 2 == 0,
                         segments=segs)


@pytest.fixture
def shards(tmp_path):
    recs = [_episode(i, 1 + i % 4) for i in range(7)]
    recs.append(_episode(99, 2, status=EpisodeStatus.INFRA_FAILURE))
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    write_shard(recs[:4], paths[0])
    write_shard(recs[4:], paths[1])
    return paths, recs


def test_source_reads_every_record_by_index(shards):
    paths, recs = shards
    src = EpisodeShardSource(paths)
    assert len(src) == len(recs)
    assert [src[i].episode_id for i in range(len(src))] == [r.episode_id for r in recs]


def test_unpacked_batches_equal_padded_reference_and_drop_infra(shards):
    paths, recs = shards
    ds = sequence_dataset(EpisodeShardSource(paths), reward_fn=lambda r: 0.25 + float(r.passed))
    batches = list(batch_dataset(ds, batch_size=3, length=32))
    kept = [r for r in recs if r.status.counts]
    ref_seqs = [s for r in kept for s in episode_to_sequences(r, 0.25 + float(r.passed))]
    ref = pad_sequences(ref_seqs, 32)
    got = {k: np.concatenate([b[k] for b in batches]) for k in BATCH_FIELDS}
    assert got["tokens"].shape == (len(ref_seqs), 32)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
        assert got[k].dtype == ref[k].dtype
    lengths = [len(s["tokens"]) for s in ref_seqs]
    assert (got["segment_ids"].sum(1) == lengths).all()


def test_packing_keeps_every_sequence_intact_with_its_own_done(shards):
    paths, recs = shards
    ds = sequence_dataset(EpisodeShardSource(paths))
    ref_seqs = [s for r in recs if r.status.counts for s in episode_to_sequences(r, float(r.passed))]
    batches = list(batch_dataset(ds, batch_size=2, length=48, pack=True, pad_id=9))
    found = []
    for b in batches:
        assert b["tokens"].shape == (2, 48)
        for row in range(b["tokens"].shape[0]):
            seg = b["segment_ids"][row]
            pad = seg == 0
            assert (b["tokens"][row][pad] == 9).all() and not b["actor_mask"][row][pad].any()
            for sid in sorted(set(seg[~pad].tolist())):
                idx = np.flatnonzero(seg == sid)
                assert (np.diff(idx) == 1).all()  # contiguous
                assert b["positions"][row][idx].tolist() == list(range(len(idx)))
                assert b["dones"][row][idx].sum() == 1  # one done per packed episode
                found.append({k: b[k][row][idx] for k in ref_seqs[0]})
    assert len(found) == len(ref_seqs)
    key = lambda s: s["tokens"].tobytes()  # noqa: E731
    for a, r in zip(sorted(found, key=key), sorted(ref_seqs, key=key)):
        for k in r:
            np.testing.assert_array_equal(a[k], r[k], err_msg=k)
    assert sum(b["segment_ids"].max(1).sum() > b["segment_ids"].shape[0] for b in batches) > 0  # some row packed >1


def test_too_long_sequence_is_an_error_not_a_cut(shards):
    paths, _ = shards
    ds = sequence_dataset(EpisodeShardSource(paths))
    with pytest.raises(ValueError, match="does not fit rows of length 4"):
        list(batch_dataset(ds, batch_size=2, length=4))


def test_missing_shard_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        EpisodeShardSource([tmp_path / "nope.jsonl"])


def test_engine_shards_feed_the_pipeline(tmp_path):
    """End to end: the rollout CLI writes real episodes; grain batches hold exactly their arrays."""
    from tr.agent.records import read_shard
    from tr.agent.rollout import main

    shard = tmp_path / "shard-0.jsonl"
    assert main(["--policy", "scripted", "--tasks", "data-csv-to-json", "log-status-summary",
                 "--group-size", "2", "--mistake-prob", "0.5", "--out", str(shard), "--concurrency", "2"]) == 0
    recs = read_shard(shard)
    assert len(recs) == 4 and len({r.group_id for r in recs}) == 2
    (batch,) = list(batch_dataset(sequence_dataset(EpisodeShardSource([shard])), batch_size=4, length=4096))
    ref = pad_sequences([s for r in recs for s in episode_to_sequences(r, float(r.passed))], 4096,
                        pad_id=0)
    for k in ref:
        np.testing.assert_array_equal(batch[k], ref[k], err_msg=k)
    assert batch["dones"].sum() == 4 and batch["rewards"].sum() == sum(bool(r.passed) for r in recs)
