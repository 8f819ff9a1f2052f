"""grain input pipeline over episode record shards (JSONL, written by ``tr.agent.records``).

    source   = EpisodeShardSource(paths)                  # random access: record i of all shards
    seqs     = sequence_dataset(source, reward_fn=...)    # IterDataset of 1-D SPEC §2 sequences
    batches  = batch_dataset(seqs, batch_size=B, length=L, pack=True)   # [B, L] dicts

A packed row holds several sequences back to back; ``segment_ids`` (1, 2, ... per sequence, 0 on
padding) and ``positions`` (restart at 0 per sequence) tell them apart, ``dones`` marks each
sequence's last action token, and ``turn_ids`` are each sequence's own.  Unpacked rows carry one
sequence each (``segment_ids`` = 1 on it).  Padding: token ``pad_id``, masks false, rewards 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import grain
import grain.experimental as gex
import numpy as np

from tr.agent.records import (
    TRAINING_DTYPES, TRAINING_FIELDS, EpisodeRecord, episode_to_sequences, parse_record_line,
)

BATCH_FIELDS = TRAINING_FIELDS + ("segment_ids", "positions")


class EpisodeShardSource:
    """A grain random-access source over JSONL shards: ``source[i]`` is the i-th EpisodeRecord.
    Line offsets are indexed once at construction."""

    def __init__(self, paths: Sequence[str | os.PathLike]):
        if not paths:
            raise ValueError("EpisodeShardSource: no shard paths given")
        self.paths = [os.fspath(p) for p in paths]
        self._index: list[tuple[int, int, int]] = []  # (shard, offset, line number)
        for s, path in enumerate(self.paths):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"episode shard {path} does not exist")
            with open(path, "rb") as f:
                offset, lineno = 0, 0
                for line in f:
                    lineno += 1
                    if line.strip():
                        self._index.append((s, offset, lineno))
                    offset += len(line)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> EpisodeRecord:
        s, offset, lineno = self._index[i]
        with open(self.paths[s], "rb") as f:
            f.seek(offset)
            line = f.readline()
        return parse_record_line(line, where=f"{self.paths[s]}:{lineno}")

    def __repr__(self) -> str:
        return f"EpisodeShardSource({len(self.paths)} shards, {len(self)} records)"


def default_reward(record: EpisodeRecord) -> float:
    """Strict pass as a float (stages pass their shaped reward, e.g. FDR or SPR, instead)."""
    return float(bool(record.passed))


class _RecordToSequences(gex.FlatMapTransform):
    """One record → its sequences (one per context window; none for records not kept)."""

    max_fan_out = 10_000

    def __init__(self, reward_fn, loss_sources, keep):
        self.reward_fn, self.loss_sources, self.keep = reward_fn, tuple(loss_sources), keep

    def flat_map(self, record: EpisodeRecord) -> list[dict]:
        if not self.keep(record):
            return []
        return episode_to_sequences(record, self.reward_fn(record), loss_sources=self.loss_sources)


def sequence_dataset(
    source: EpisodeShardSource,
    *,
    reward_fn: Callable[[EpisodeRecord], float] = default_reward,
    loss_sources: Sequence[str] = ("policy", "teacher"),
    keep: Callable[[EpisodeRecord], bool] = lambda r: r.status.counts,
    shuffle_seed: int | None = None,
) -> grain.IterDataset:
    """Records → 1-D sequences (one per context window), dropping records ``keep`` rejects
    (default: infra failures and cancelled episodes)."""
    ds = grain.MapDataset.source(source)
    if shuffle_seed is not None:
        ds = ds.shuffle(seed=shuffle_seed)
    return gex.FlatMapIterDataset(ds.to_iter_dataset(),
                                  _RecordToSequences(reward_fn, loss_sources, keep))


def _pad_one(seq: dict, length: int, pad_id: int) -> dict:
    n = len(_check_fits(seq, length)["tokens"])
    out = {}
    for k in TRAINING_FIELDS:
        row = np.zeros(length, TRAINING_DTYPES[k])
        row[:n] = seq[k]
        out[k] = row
    out["tokens"][n:] = pad_id
    out["segment_ids"] = np.zeros(length, np.int32)
    out["segment_ids"][:n] = 1
    out["positions"] = np.zeros(length, np.int32)
    out["positions"][:n] = np.arange(n, dtype=np.int32)
    return out


def _from_packed(row: dict, pad_id: int) -> dict:
    out = {k: np.asarray(row[k], TRAINING_DTYPES[k]) for k in TRAINING_FIELDS}
    out["segment_ids"] = np.asarray(row["tokens_segment_ids"], np.int32)
    out["positions"] = np.asarray(row["tokens_positions"], np.int32)
    out["tokens"] = np.where(out["segment_ids"] == 0, np.int32(pad_id), out["tokens"])
    return out


def _check_fits(seq: dict, length: int) -> dict:
    n = len(seq["tokens"])
    if n > length:
        raise ValueError(f"a sequence of {n} tokens does not fit rows of length {length}; "
                         "raise the row length or filter long episodes")
    return seq


def batch_dataset(
    sequences: grain.IterDataset,
    *,
    batch_size: int,
    length: int,
    pack: bool = False,
    pad_id: int = 0,
    drop_remainder: bool = False,
    packing_bins: int | None = None,
) -> grain.IterDataset:
    """``[batch_size, length]`` batches of :data:`BATCH_FIELDS`.  ``pack``: first-fit packing of
    several sequences per row (grain's ``FirstFitPackIterDataset``, ``packing_bins`` rows open at
    once, default ``batch_size``).  A sequence longer than ``length`` raises ValueError."""
    if batch_size < 1 or length < 1:
        raise ValueError(f"batch_size={batch_size} and length={length} must be >= 1")
    if pack:
        ds = sequences.map(lambda s: _check_fits(s, length))
        ds = gex.FirstFitPackIterDataset(
            ds, length_struct={k: length for k in TRAINING_FIELDS},
            num_packing_bins=packing_bins or batch_size, shuffle_bins=False)
        ds = ds.map(lambda r: _from_packed(r, pad_id))
    else:
        ds = sequences.map(lambda s: _pad_one(s, length, pad_id))
    return ds.batch(batch_size, drop_remainder=drop_remainder)
