"""Metrics of a stage: a rollout batch's summary, `metrics.jsonl` (with TensorBoard scalars and
progress lines), and host floats of device metrics."""

from __future__ import annotations

import json
import math
import pathlib
import sys
import time
from typing import Sequence

import jax
import numpy as np

from tr.agent.records import EpisodeRecord
from tr.stages import progress, scalars


def rollout_summary(records: Sequence[EpisodeRecord], rewards: Sequence[float]) -> dict:
    """Pass rate, mean reward, turns and statuses of one rollout batch."""
    counted = [i for i, r in enumerate(records) if r.status.counts]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    return {
        "episodes": len(records),
        "pass_rate": (float(np.mean([bool(records[i].passed) for i in counted]))
                      if counted else None),
        "reward_mean": float(np.mean([rewards[i] for i in counted])) if counted else None,
        "turns_mean": (float(np.mean([records[i].num_turns for i in counted]))
                       if counted else None),
        "statuses": statuses,
    }


class MetricsLog:
    """`metrics.jsonl`: one JSON line per update, the same scalars as TensorBoard event files in
    the same folder (:class:`tr.stages.scalars.ScalarWriter`); a progress line on stderr per
    iteration (:func:`tr.stages.progress.line`: the run's stage i/N, and an ETA when given the
    iterations done and due).

    `truncate(iteration)` drops the lines of iterations ≥ `iteration` (written by a run killed
    after its update but before its checkpoint), so a resumed stage never repeats a line; the
    event files drop the same steps (TensorBoard's purge at the first dropped step).
    """

    def __init__(self, path: pathlib.Path, stream=None):
        self.path = path
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()
        self.board = scalars.ScalarWriter(path.parent)
        self.start = 0      # iterations done before this process (set by truncate)

    def truncate(self, iteration: int) -> None:
        self.start = iteration
        if not self.path.exists():
            return
        kept, dropped = [], []
        for line in self.path.read_text().splitlines():
            if line.strip():
                parsed = json.loads(line)
                (kept.append(line) if parsed["iteration"] < iteration else dropped.append(parsed["step"]))
        if dropped:
            self.board.purge_step = min(dropped)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)

    def write(self, lines: Sequence[dict]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
        self.board.write(lines)

    def progress(self, text: str, *, done: int | None = None, total: int | None = None) -> None:
        """A line on stderr; `done` of `total` iterations adds tqdm's meter (its ETA counts the
        iterations past the resumed-from one given to :meth:`truncate`: those cost nothing here)."""
        self.stream.write(progress.line(text, time.monotonic() - self.t0, done=done, total=total,
                                        initial=self.start) + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.board.close()


def read_metrics(path: pathlib.Path) -> list[dict]:
    """The lines of a `metrics.jsonl`."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def to_host(metrics: dict) -> dict:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def finite_or_none(value):
    """`value` as a float, or None where it is missing or not finite (an undefined EV: JSON has no
    NaN or infinity)."""
    return float(value) if value is not None and math.isfinite(value) else None
