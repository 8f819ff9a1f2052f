"""Reading a stage folder's TensorBoard event files back with TensorBoard's own reader, and the
scalars a `metrics.jsonl` should have put there (a reference written apart from tr.stages.scalars)."""

import json
import math
import pathlib

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


def read_scalars(folder) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} as TensorBoard shows them (purged steps of a resumed run dropped)."""
    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a step written twice: {steps}"
        out[tag] = {e.step: e.value for e in events}
    return out


def expected_scalars(metrics_jsonl) -> dict[str, dict[int, float]]:
    """Every number of every line, nested names joined with '/', at the line's step, as float32."""
    out: dict[str, dict[int, float]] = {}

    def walk(step, obj, names):
        for key, value in obj.items():
            if isinstance(value, dict):
                walk(step, value, names + [key])
            elif type(value) in (int, float) and names + [key] != ["step"]:
                out.setdefault("/".join(names + [key]), {})[step] = float(np.float32(value))

    for text in pathlib.Path(metrics_jsonl).read_text().splitlines():
        line = json.loads(text)
        walk(line["step"], line, [])
    return out


def assert_same_scalars(got, want) -> None:
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))
    for tag in want:
        assert got[tag].keys() == want[tag].keys(), tag
        for step, value in want[tag].items():
            g = got[tag][step]
            assert g == value or (math.isnan(g) and math.isnan(value)), (tag, step, g, value)
