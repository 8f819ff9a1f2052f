"""grain pipeline over episode shards: padding and packing checked against the per-episode arrays."""

import itertools

import grain
import numpy as np
import pytest

from tr.agent.records import (
    EpisodeRecord, EpisodeStatus, Segment, episode_to_sequences, pad_sequences, write_shard,
)
from tr.data.episodes import (
    BATCH_FIELDS, EpisodeShardSource, batch_dataset, epochs, packed_batches, padded_batches,
    sequence_dataset,
)


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


# ----------------------------------------------------------------------------------------------
# The stages' rows (Base / ReTerm SFT packed, RSR SFT padded, RPR packed): grain's shuffle and
# first-fit packer, checked against references built the obvious way from grain's own shuffle.

def _seqs(n: int, seed: int = 0) -> list[dict]:
    """n sequences with distinct first tokens (the id i + 1) and random lengths 3..20."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m = int(rng.integers(3, 21))
        tokens = np.concatenate([[i + 1], rng.integers(100, 200, m - 1)]).astype(np.int32)
        out.append({"tokens": tokens, "loss_mask": rng.random(m) < 0.7})
    return out


def _full(seqs: list[dict]) -> list[dict]:
    """SFT sequences with every SPEC §2 field (what RSR's episode_to_sequences gives)."""
    return [{"tokens": s["tokens"], "actor_mask": s["loss_mask"].copy(), "loss_mask": s["loss_mask"],
             "turn_ids": np.ones(len(s["tokens"]), np.int32),
             "rewards": np.zeros(len(s["tokens"]), np.float32),
             "dones": np.zeros(len(s["tokens"]), bool),
             "logprobs": np.zeros(len(s["tokens"]), np.float32)} for s in seqs]


def _grain_epoch(n: int, seed: int) -> list[int]:
    """Epoch e's order of `epochs(seed=S)` is a plain grain shuffle of 0..n-1 seeded S + e."""
    return list(grain.MapDataset.range(n).shuffle(seed=seed))


def test_epochs_visit_every_sequence_once_per_epoch_in_grains_shuffle():
    seqs = _seqs(11)
    ds = epochs(seqs, seed=5)
    for e in range(3):
        got = [int(ds[e * 11 + i]["tokens"][0]) - 1 for i in range(11)]
        assert sorted(got) == list(range(11))
        assert got == _grain_epoch(11, 5 + e)
    assert [int(ds[i]["tokens"][0]) for i in range(11)] != list(range(1, 12))   # shuffled
    assert [int(ds[i]["tokens"][0]) for i in range(11, 22)] != [int(ds[i]["tokens"][0]) for i in range(11)]


def test_padded_batches_are_rsr_passes_with_only_the_last_batch_padded():
    seqs = _full(_seqs(10))
    ds = padded_batches(seqs, batch=4, length=24, seed=3, pad_id=0)
    per_pass = 3                                                        # ceil(10 / 4)
    for step in range(2 * per_pass):
        p, index = divmod(step, per_pass)
        chosen = [seqs[i] for i in _grain_epoch(10, 3 + p)[index * 4:(index + 1) * 4]]
        ref = pad_sequences(chosen, 24)
        batch = ds[step]
        assert set(batch) == set(ref) and batch["tokens"].shape == (4, 24)
        for k in ref:
            np.testing.assert_array_equal(batch[k][:len(chosen)], ref[k], err_msg=k)
            assert not batch[k][len(chosen):].any(), k                  # padding rows: all zero
        assert 0 < batch["loss_mask"].any(axis=1).sum() == len(chosen)  # never only padding
    resumed = padded_batches(seqs, batch=4, length=24, seed=3)[4]         # no state: a resumed
    np.testing.assert_array_equal(resumed["tokens"], ds[4]["tokens"])  # stage reads ds[step]
    with pytest.raises(ValueError, match="no sequences"):
        padded_batches([], batch=4, length=24, seed=0)


def test_packed_batches_pack_grains_shuffled_stream_first_fit():
    seqs = _seqs(13, seed=1)
    length, batch = 40, 3
    got = list(itertools.islice(packed_batches(seqs, batch=batch, length=length, seed=7,
                                               pad_id=9), 12))
    stream = [i for e in range(20) for i in _grain_epoch(13, 7 + e)]
    # the reference: first-fit into `batch` open rows; a sequence that fits none emits them all
    rows, open_rows, free = [], [[]], [length]
    for i in stream:
        n = len(seqs[i]["tokens"])
        r = next((r for r, f in enumerate(free) if f >= n), None)
        if r is None and len(open_rows) < batch:
            open_rows.append([])
            free.append(length)
            r = len(open_rows) - 1
        if r is None:
            rows += open_rows
            open_rows, free, r = [[]], [length], 0
        open_rows[r].append(i)
        free[r] -= n
    for b, out in enumerate(got):
        assert set(out) == {"tokens", "loss_mask", "segment_ids"}
        assert out["tokens"].shape == (batch, length)
        for r in range(batch):
            members, ids = rows[b * batch + r], out["segment_ids"][r]
            assert ids.max() == len(members)
            for k, i in enumerate(members, start=1):
                np.testing.assert_array_equal(out["tokens"][r][ids == k], seqs[i]["tokens"])
                np.testing.assert_array_equal(out["loss_mask"][r][ids == k], seqs[i]["loss_mask"])
            used = (ids > 0).sum()
            assert used == sum(len(seqs[i]["tokens"]) for i in members) <= length
            assert (ids[:used] > 0).all() and (out["tokens"][r][used:] == 9).all()
            assert not out["loss_mask"][r][used:].any()
    assert any(len(r) > 1 for r in rows[:12 * batch])                    # rows hold several
    again = next(iter(packed_batches(seqs, batch=batch, length=length, seed=7, pad_id=9)))
    np.testing.assert_array_equal(again["tokens"], got[0]["tokens"])      # deterministic
    other = next(iter(packed_batches(seqs, batch=batch, length=length, seed=8, pad_id=9)))
    assert (other["tokens"] != got[0]["tokens"]).any()


def test_packed_batches_take_reterms_two_field_rows_beside_full_ones():
    seqs = _seqs(4) + _full(_seqs(4, seed=2))
    out = next(iter(packed_batches(seqs, batch=2, length=64, seed=0)))
    assert out["tokens"].dtype == np.int32 and out["loss_mask"].dtype == bool
    with pytest.raises(ValueError, match="does not fit rows of length 8"):
        next(iter(packed_batches(seqs, batch=2, length=8, seed=0)))
