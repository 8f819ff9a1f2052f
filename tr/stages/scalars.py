"""A stage's scalars for dashboards: TensorBoard event files beside its `metrics.jsonl`, and
Weights & Biases when asked for.

Every number in a metrics line becomes a scalar under the line's own name, nested objects joined
with `/` (`{"rollouts": {"pass_rate": 0.5}}` -> `rollouts/pass_rate`, `actor/loss` stays
`actor/loss`), at the line's `step`; strings, booleans, lists and nulls are not scalars.  The event
files live in the stage folder, so `tensorboard --logdir RUN` shows one TensorBoard run per stage.

A resumed stage passes `purge_step` (the first step it will write again): TensorBoard then drops the
earlier files' events at or past it, as `metrics.jsonl` drops its lines.

W&B: set `TR_WANDB_PROJECT` (and optionally `TR_WANDB_ENTITY`) to also log each line to a W&B run
named after the stage folder (`RUN/STAGE`); `wandb` is then imported, so install it first.  Unset,
nothing of W&B is touched.  Writing here is file I/O only: no random numbers, nothing a run
computes depends on it.
"""

from __future__ import annotations

import logging
import math
import os
import pathlib
import time
import weakref
from collections.abc import Mapping, Sequence

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.summary import scalar as scalar_summary

# A NaN is a legitimate scalar here (an explained variance with no variance to explain, SPEC);
# tensorboardX would warn once per such value.
logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)

WANDB_PROJECT_ENV = "TR_WANDB_PROJECT"
WANDB_ENTITY_ENV = "TR_WANDB_ENTITY"


def flatten_scalars(line: Mapping, prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics line by name (nested keys joined with `/`), `step` excluded."""
    out: dict[str, float] = {}
    for key, value in line.items():
        name = f"{prefix}{key}"
        if not prefix and key == "step":
            continue
        if isinstance(value, Mapping):
            out.update(flatten_scalars(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class ScalarWriter:
    """Writes metrics lines (each with an integer `step`) as TensorBoard scalars into `logdir`.

    Synchronous on purpose: tensorboardX's `SummaryWriter` queues events for a writer thread and
    its `flush` does not wait for that queue, so a killed run would lose its last lines (and a
    reader would not see them for up to two minutes).  Here each :meth:`write` appends the events
    to one event file (tensorboardX's `EventsWriter`, opened at the first write) and flushes it to
    disk; :meth:`close` (or garbage collection) closes the file."""

    def __init__(self, logdir: pathlib.Path, *, purge_step: int | None = None):
        self.logdir = pathlib.Path(logdir)
        self.purge_step = purge_step
        self._events: EventsWriter | None = None
        self._wandb = None
        self._finalizer = None

    def _open(self) -> EventsWriter:
        if self._events is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            # The nanosecond suffix keeps two files of one second (a resume right after a kill)
            # apart, and keeps the names in time order, the order TensorBoard reads them in.
            self._events = EventsWriter(str(self.logdir / "events"), filename_suffix=f".{time.time_ns()}")
            self._finalizer = weakref.finalize(self, self._events.close)
            if self.purge_step is not None:   # TensorBoard drops earlier files' events at steps >= it
                self._events.write_event(Event(wall_time=time.time(), step=self.purge_step,
                                               session_log=SessionLog(status=SessionLog.START)))
            if os.environ.get(WANDB_PROJECT_ENV):
                self._wandb = _wandb_run(self.logdir)
        return self._events

    def write(self, lines: Sequence[Mapping]) -> None:
        if not lines:
            return
        events = self._open()
        for line in lines:
            step = line.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                raise ValueError(f"{self.logdir}: a metrics line needs an integer 'step', got {step!r}")
            values = flatten_scalars(line)
            now = time.time()
            for name, value in values.items():
                events.write_event(Event(wall_time=now, step=step, summary=scalar_summary(name, value)))
            if self._wandb is not None:
                self._wandb.log({k: v for k, v in values.items() if math.isfinite(v)}, step=step)
        events.flush()

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_run(logdir: pathlib.Path):
    """A W&B run for one stage folder (only when `TR_WANDB_PROJECT` is set)."""
    try:
        import wandb  # pylint: disable=g-import-not-at-top  (optional: only when configured)
    except ImportError:
        raise RuntimeError(f"{WANDB_PROJECT_ENV} is set but the 'wandb' package is not installed: "
                           f"pip install wandb, or unset {WANDB_PROJECT_ENV}") from None
    return wandb.init(project=os.environ[WANDB_PROJECT_ENV], entity=os.environ.get(WANDB_ENTITY_ENV),
                      name=f"{logdir.parent.name}/{logdir.name}", dir=str(logdir), reinit="create_new")
