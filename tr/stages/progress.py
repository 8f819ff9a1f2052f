"""Run-level progress on stderr: which stage of the run is running (`stage i/N`), and within it the
iterations done, the time taken and the ETA, formatted by tqdm's meter.

One line per event, no carriage returns, so a run's log file reads the same as its terminal:

    [  612.3s] [stage 3/6 rpr1] rpr1 it 4/10 (ppo) step 4: pass 0.5 ...  4/10 [01:40<02:30, 25.00s/it]

The pipeline drivers enter :func:`stage` around each stage; the stages' own progress lines
(:meth:`tr.stages.metrics.MetricsLog.progress`) carry its label.  Only clocks are read: nothing here
touches what a run computes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from tqdm import tqdm

_state = threading.local()
METER = "{n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"


@contextlib.contextmanager
def stage(index: int, total: int, name: str, kind: str = "", stream=None):
    """Marks stage `index` (0-based) of `total` as running; prints its start and end lines."""
    stream = stream if stream is not None else sys.stderr
    previous = getattr(_state, "label", "")
    _state.label = f"stage {index + 1}/{total} {name}"
    t0 = time.monotonic()
    stream.write(f"[{_state.label}] start{f' ({kind})' if kind else ''}\n")
    stream.flush()
    try:
        yield
        stream.write(f"[{_state.label}] done in {tqdm.format_interval(time.monotonic() - t0)}\n")
        stream.flush()
    finally:
        _state.label = previous


def label() -> str:
    """`stage i/N NAME` of the stage running in this thread, or '' outside a pipeline."""
    return getattr(_state, "label", "")


def meter(done: int, total: int, elapsed_s: float, *, initial: int = 0) -> str:
    """`done/total [elapsed<remaining, rate]`; the rate counts only the `done - initial`
    iterations of this process (a resumed stage's earlier ones took no time here)."""
    return tqdm.format_meter(done, total, elapsed_s, bar_format=METER, unit="it", initial=initial)


def line(text: str, elapsed_s: float, *, done: int | None = None, total: int | None = None,
         initial: int = 0) -> str:
    """A progress line: elapsed seconds, the stage label, `text`, and the meter when `done` and
    `total` are given."""
    tag = f" [{label()}]" if label() else ""
    tail = f"  {meter(done, total, elapsed_s, initial=initial)}" if done is not None and total else ""
    return f"[{elapsed_s:7.1f}s]{tag} {text}{tail}"
