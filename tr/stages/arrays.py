"""Training arrays of a rollout batch: SPEC §2 `[rows, length]` arrays, padded or packed, with the
window links TB-GAE carries across."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tr.agent.records import EpisodeRecord, episode_to_sequences, pad_sequences
from tr.data import episodes
from tr.stages.registry import ConfigError


def training_arrays(records: Sequence[EpisodeRecord], rewards: Sequence[float], *, rows: int,
                    length: int, num_windows: int = 1, pack_multiple: int = 0
                    ) -> tuple[dict[str, np.ndarray], dict]:
    """`[rows, length]` SPEC §2 arrays of the counted records, one context window per row.

    With `pack_multiple = m > 0` the windows are packed several to a row (`episodes.pack_rows`:
    grain's first-fit packer fed the windows longest first, `segment_ids` and `positions` per
    window) and the batch has the fewest rows,
    a multiple of m, that hold them (at most `rows`): the same tokens, masks and targets in fewer
    rows, so an update costs what the tokens cost, not what the padding costs. Token-mean losses
    and the advantage recursion (cut at each window's done) do not change; at most `rows / m`
    batch shapes compile. Packing needs one window per episode (`num_windows = 1`).

    With `num_windows > 1` an episode split by summarisation keeps its reward and done on its last
    window only and its rows are linked (`window_ids`, `next_window_row`) so TB-GAE is carried
    across them; with 1, each window is scored by the episode outcome on its own. Rows past the
    data are padding (all masks false). Too many rows, a window longer than `length`, or more
    windows than `num_windows` raise, naming the config field.
    """
    if pack_multiple and (num_windows > 1 or rows % pack_multiple):
        raise ConfigError(f"arrays.pack_multiple={pack_multiple} needs train.ppo.num_windows = 1 "
                          f"(got {num_windows}) and divides arrays.rows={rows}")
    seqs, window_ids, next_row, stats = [], [], [], {"truncated_rows": 0}
    for record, reward in zip(records, rewards):
        if not record.status.counts:
            continue
        windows = episode_to_sequences(record, float(reward))
        if num_windows > 1:
            if len(windows) > num_windows:
                raise ConfigError(f"episode {record.episode_id} has {len(windows)} context windows "
                                  f"> train.ppo.num_windows={num_windows}")
            for w in windows[:-1]:
                w["rewards"][:] = 0.0
                w["dones"][:] = False
        first = len(seqs)
        for w, seq in enumerate(windows):
            seqs.append(seq)
            window_ids.append(w if num_windows > 1 else 0)
            linked = num_windows > 1 and w + 1 < len(windows)
            next_row.append(first + w + 1 if linked else -1)
    if len(seqs) > rows:
        raise ConfigError(f"{len(seqs)} context windows do not fit arrays.rows={rows}")
    too_long = [len(s["tokens"]) for s in seqs if len(s["tokens"]) > length]
    if too_long:
        raise ConfigError(f"a context window of {max(too_long)} tokens does not fit "
                          f"arrays.length={length}")
    if pack_multiple:
        # at most `rows`: the windows fit `rows` one to a row, and m divides `rows`
        batch, _ = episodes.pack_rows(seqs, length, multiple=pack_multiple)
        packed_rows = batch["tokens"].shape[0]
        batch["window_ids"] = np.zeros(packed_rows, np.int32)
        batch["next_window_row"] = np.full(packed_rows, -1, np.int32)
    else:
        batch = pad_sequences(seqs, length) if seqs else pad_sequences([], length)
        pad = rows - len(seqs)
        batch = {k: np.concatenate([v, np.zeros((pad, length), v.dtype)]) for k, v in batch.items()}
        batch["window_ids"] = np.asarray(window_ids + [0] * pad, np.int32)
        batch["next_window_row"] = np.asarray(next_row + [-1] * pad, np.int32)
    tokens = int(sum(len(s["tokens"]) for s in seqs))
    stats.update(windows=len(seqs), action_tokens=int(batch["actor_mask"].sum()), tokens=tokens,
                 rows=int(batch["tokens"].shape[0]),
                 fill=round(tokens / batch["tokens"].size, 4))
    return batch, stats
