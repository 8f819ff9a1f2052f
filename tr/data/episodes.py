"""grain input pipelines: the training path's row shuffling and packing, and episode record shards.

    epochs(seqs, seed=S)                   # endless epochs, each grain's index shuffle (seed S + e)
    padded_batches(seqs, batch=B, ...)[s]  # RSR SFT: update s's rows, one sequence each (random access)
    packed_batches(seqs, batch=B, ...)     # Base / ReTerm SFT: endless first-fit packed batches
    pack_rows(seqs, L, multiple=m)         # RPR / warm-up: one rollout batch in the fewest rows

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
    TRAINING_DTYPES, TRAINING_FIELDS, EpisodeRecord, episode_to_sequences, pad_sequences,
    parse_record_line,
)

BATCH_FIELDS = TRAINING_FIELDS + ("segment_ids", "positions")
SFT_FIELDS = ("tokens", "loss_mask")          # what an SFT sequence needs (ReTerm's rows hold no more)
_IN_MEMORY = grain.ReadOptions(num_threads=0)  # sequences already in memory: no reader threads


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


def _pad_one(seq: dict, length: int, pad_id: int, fields: Sequence[str]) -> dict:
    n = len(_check_fits(seq, length)["tokens"])
    out = {}
    for k in fields:
        row = np.zeros(length, TRAINING_DTYPES[k])
        row[:n] = seq[k]
        out[k] = row
    out["tokens"][n:] = pad_id
    out["segment_ids"] = np.zeros(length, np.int32)
    out["segment_ids"][:n] = 1
    out["positions"] = np.zeros(length, np.int32)
    out["positions"][:n] = np.arange(n, dtype=np.int32)
    return out


def _from_packed(row: dict, pad_id: int, fields: Sequence[str]) -> dict:
    out = {k: np.asarray(row[k], TRAINING_DTYPES[k]) for k in fields}
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
    fields: Sequence[str] = TRAINING_FIELDS,
) -> grain.IterDataset:
    """``[batch_size, length]`` batches of ``fields`` plus ``segment_ids`` and ``positions``.
    ``pack``: first-fit packing of several sequences per row (grain's ``FirstFitPackIterDataset``,
    ``packing_bins`` rows open at once, default ``batch_size``).  A sequence longer than ``length``
    raises ValueError."""
    if batch_size < 1 or length < 1:
        raise ValueError(f"batch_size={batch_size} and length={length} must be >= 1")
    fields = tuple(fields)
    if pack:
        ds = _pack(sequences, length=length, bins=packing_bins or batch_size, fields=fields,
                   pad_id=pad_id)
    else:
        ds = sequences.map(lambda s: _pad_one(s, length, pad_id, fields))
    return ds.batch(batch_size, drop_remainder=drop_remainder)


def _pack(sequences: grain.IterDataset, *, length: int, bins: int, fields: tuple[str, ...],
          pad_id: int, meta: tuple[str, ...] = ()) -> grain.IterDataset:
    """First-fit packed rows of ``fields`` (+ ``segment_ids``, ``positions``): each sequence goes
    to the first of ``bins`` open rows it fits; one that fits none emits them all (in order, the
    bins not shuffled).  ``meta``: per-sequence scalars, a row holds the list of its sequences'."""
    def select(seq: dict) -> dict:
        out = {k: np.asarray(seq[k], TRAINING_DTYPES[k]) for k in fields}
        out.update({k: seq[k] for k in meta})
        return _check_fits(out, length)

    ds = gex.FirstFitPackIterDataset(
        sequences.map(select), length_struct={k: length for k in fields}, num_packing_bins=bins,
        shuffle_bins=False, meta_features=meta)
    return ds.map(lambda r: {**_from_packed(r, pad_id, fields), **{k: r[k] for k in meta}})


# ----------------------------------------------------------------------------------------------
# The stages' training rows: sequences in memory, shuffled and packed by grain.

def _shuffled(seqs: Sequence[dict], seed: int) -> grain.MapDataset:
    if not seqs:
        raise ValueError("no sequences to make training rows of")
    return grain.MapDataset.source(list(seqs)).shuffle(seed=seed)


def epochs(seqs: Sequence[dict], *, seed: int) -> grain.MapDataset:
    """``seqs`` in endless epochs: element ``e·n + i`` is the i-th sequence of epoch ``e``, whose
    order is grain's index shuffle seeded ``seed + e``.  Each epoch is a fresh permutation (every
    sequence once per epoch), and any element is a function of its index alone."""
    return _shuffled(seqs, seed).repeat()


def padded_batches(seqs: Sequence[dict], *, batch: int, length: int, seed: int,
                   pad_id: int = 0) -> grain.MapDataset:
    """Random access: ``ds[step]`` is update ``step``'s ``[batch, length]`` rows of
    :data:`TRAINING_FIELDS`, one sequence per row (``records.pad_sequences``).  Pass
    ``p = step // ceil(n / batch)`` visits the sequences in epoch ``p`` of :func:`epochs`; the last
    batch of a pass is filled with padding rows (token ``pad_id``, masks false), never only
    padding.  A stage resumed at update ``s`` reads ``ds[s]``: nothing is replayed."""
    def stack(chosen: Sequence[dict]) -> dict:
        out = {k: np.zeros((batch, length), TRAINING_DTYPES[k]) for k in TRAINING_FIELDS}
        out["tokens"][:] = pad_id
        for k, v in pad_sequences(chosen, length, pad_id=pad_id).items():
            out[k][:len(chosen)] = v
        return out

    if batch < 1:
        raise ValueError(f"batch={batch} must be >= 1")
    return _shuffled(seqs, seed).batch(batch, batch_fn=stack).repeat()


def packed_batches(seqs: Sequence[dict], *, batch: int, length: int, seed: int,
                   pad_id: int = 0) -> grain.IterDataset:
    """Endless SFT batches ``{tokens, loss_mask, segment_ids}`` ``[batch, length]``: the
    :func:`epochs` stream first-fit packed several sequences to a row (:func:`batch_dataset`,
    ``batch`` rows open at once; segments 1, 2, ... per sequence, 0 on padding; the model derives
    positions from them), cut into batches.  A row may hold the end of one epoch and the start of
    the next.  Deterministic in ``seed``: a stage resumed at update ``s`` skips ``s`` batches."""
    ds = batch_dataset(epochs(seqs, seed=seed).to_iter_dataset(_IN_MEMORY), batch_size=batch,
                       length=length, pack=True, pad_id=pad_id, drop_remainder=True,
                       fields=SFT_FIELDS)
    return ds.map(lambda b: {k: b[k] for k in SFT_FIELDS + ("segment_ids",)})


def pack_rows(seqs: Sequence[dict], length: int, *, multiple: int = 1, pad_id: int = 0
              ) -> tuple[dict[str, np.ndarray], list[list[int]]]:
    """One rollout batch packed into ``[rows, length]`` arrays of :data:`BATCH_FIELDS`: first-fit
    decreasing (grain's first-fit packer, one bin per sequence, fed the sequences longest first,
    ties in input order), so the rows are the fewest first-fit decreasing finds, at least one,
    rounded up to a multiple of ``multiple`` with empty rows.  Each sequence keeps its own
    ``dones``, so the advantage recursion stops at its end and the attention mask at its segment.
    Returns the arrays and each row's sequence indices in segment order (segment k = entry k-1)."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]["tokens"]))
    ds = grain.MapDataset.source([{**seqs[i], "index": np.int64(i)} for i in order])
    rows = list(_pack(ds.to_iter_dataset(_IN_MEMORY), length=length, bins=max(1, len(seqs)),
                      fields=TRAINING_FIELDS, pad_id=pad_id, meta=("index",)))
    total = max(1, -(-len(rows) // multiple)) * multiple
    empty = {k: np.zeros(length, TRAINING_DTYPES.get(k, np.int32)) for k in BATCH_FIELDS}
    empty["tokens"][:] = pad_id
    rows += [empty] * (total - len(rows))
    batch = {k: np.stack([r[k] for r in rows]) for k in BATCH_FIELDS}
    return batch, [[int(i) for i in r.get("index", [])] for r in rows]
