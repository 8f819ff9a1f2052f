"""Family profiling: trajectory files in, the frozen scale table ``{family: D, D', rule}`` out.

A training phase reads the table written here and keeps it fixed, so a run's rewards are
reproducible from its files; ``python -m tr.rewards.rescore --scales`` reads the same table.

Trajectory files are JSONL, one trajectory per line. Accepted per line (a JSON object); a field
that is ``null`` (or, for ``family``, an empty string) counts as absent and the search goes on:

* ``family`` (non-empty str): top level, else ``task.family``, else ``verifier.family``.
* ``matched`` (number, finite, may be negative), ``executed`` (int ≥ 0), ``strict_pass`` (bool, or
  0/1): top level, else the first of the nested objects ``verifier``, ``verifier_result``,
  ``verification``, ``result``, ``result.verifier``, ``outcome`` that holds the field.
* ``turns``: an int ≥ 0, or a list of turns whose count is taken (items that are objects with
  ``"kind": "summary"`` are not agent turns and are not counted), named ``turns``, ``num_turns``
  or ``n_turns``, at top level, else under ``result``, ``episode`` or ``stats``.

This covers flat lines ``{"family", "matched", "executed", "strict_pass", "turns"}`` and the
episode records of the rollout engine (``tr.agent.records.EpisodeRecord.to_json()``: ``family``,
``verifier: {matched, executed, strict_pass}``, ``turns: [...]``). A record whose ``status`` is
``infra_failure`` or ``cancelled`` has no agent outcome: it is excluded and reported, not an error.

Blank lines are ignored. Anything else (not JSON, not an object, a missing field, a wrong type, a
negative ``executed``, a file with no trajectory) is an error naming the file and line.

Command::

    python -m tr.rewards.profile ROLLOUTS.jsonl [MORE.jsonl ...] --out scales.json \
        [--quantile 0.9] [--failure-threshold 1.0] [--skip-bad]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tr.rewards import shaping

_VERIFIER_PATHS = (
    (),
    ("verifier",),
    ("verifier_result",),
    ("verification",),
    ("result",),
    ("result", "verifier"),
    ("outcome",),
)
_FAMILY_PATHS = ((), ("task",), ("verifier",))
_EXCLUDED_STATUSES = ("infra_failure", "cancelled")
_TURNS_PATHS = ((), ("result",), ("episode",), ("stats",))
_TURNS_NAMES = ("turns", "num_turns", "n_turns")


class TrajectoryInputError(ValueError):
    """A bad trajectory line or file; ``str()`` is ``FILE:LINE: message``."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line, self.message = path, line, message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


class ExcludedRecord(ValueError):
    """A well-formed record without an agent outcome (infra failure, cancelled)."""


@dataclass(frozen=True)
class BadLine:
    """A line left out: bad (only with ``skip_bad``) or an excluded record (always)."""

    path: str
    line: int
    message: str
    excluded: bool = False

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _lookup(record: Mapping, paths: Sequence[tuple[str, ...]], names: Sequence[str]) -> Any:
    """First value found for any of ``names`` in the nested objects at ``paths`` (in order)."""
    for path in paths:
        node: Any = record
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            continue
        for name in names:
            value = node.get(name)
            if value is not None and value != "":
                return value
    raise KeyError(names[0])


def _where(paths: Sequence[tuple[str, ...]]) -> str:
    return ", ".join("top level" if not p else ".".join(p) for p in paths)


def parse_trajectory(record: Any) -> dict[str, Any]:
    """A decoded JSON line → ``{family, matched, executed, strict_pass, turns}``; ValueError if bad."""
    if not isinstance(record, Mapping):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    status = record.get("status")
    if status in _EXCLUDED_STATUSES:
        raise ExcludedRecord(f"status {status!r} has no agent outcome")

    def field(paths, names):
        try:
            return _lookup(record, paths, names)
        except KeyError:
            raise ValueError(f"missing field '{names[0]}' (looked at {_where(paths)})") from None

    family = field(_FAMILY_PATHS, ("family",))
    if not isinstance(family, str) or not family:
        raise ValueError(f"field 'family' must be a non-empty string, got {family!r}")
    matched = field(_VERIFIER_PATHS, ("matched",))
    if isinstance(matched, bool) or not isinstance(matched, (int, float)):
        raise ValueError(f"field 'matched' must be a number, got {matched!r}")
    if not math.isfinite(matched):
        raise ValueError(f"field 'matched' must be finite, got {matched!r}")
    executed = field(_VERIFIER_PATHS, ("executed",))
    if isinstance(executed, bool) or not isinstance(executed, int):
        raise ValueError(f"field 'executed' must be an integer, got {executed!r}")
    if executed < 0:
        raise ValueError(f"field 'executed' must be >= 0, got {executed}")
    strict_pass = field(_VERIFIER_PATHS, ("strict_pass",))
    if not isinstance(strict_pass, bool) and strict_pass not in (0, 1):
        raise ValueError(f"field 'strict_pass' must be a boolean (or 0/1), got {strict_pass!r}")
    if isinstance(strict_pass, float):
        raise ValueError(f"field 'strict_pass' must be a boolean (or 0/1), got {strict_pass!r}")
    turns = field(_TURNS_PATHS, _TURNS_NAMES)
    if isinstance(turns, list):
        turns = sum(1 for t in turns if not (isinstance(t, Mapping) and t.get("kind") == "summary"))
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 0:
        raise ValueError(f"field 'turns' must be an integer >= 0 or a list, got {turns!r}")
    return {
        "family": family,
        "matched": matched,
        "executed": executed,
        "strict_pass": bool(strict_pass),
        "turns": turns,
    }


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg})") from None


def read_trajectories(
    paths: Iterable[str | Path], *, skip_bad: bool = False
) -> tuple[shaping.Trajectories, list[BadLine]]:
    """Read JSONL trajectory files into columns.

    Raises `TrajectoryInputError` at the first bad line, or, with ``skip_bad``, returns the bad
    lines next to the good trajectories (excluded records are returned in both modes). An
    unreadable file, or a file with no good trajectory, is always an error.
    """
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    for path in paths:
        path = str(path)
        good_in_file = nonblank_in_file = 0
        try:
            with open(path, encoding="utf-8") as handle:
                for number, text in enumerate(handle, start=1):
                    if not text.strip():
                        continue
                    nonblank_in_file += 1
                    try:
                        rows.append(parse_trajectory(_decode(text)))
                        good_in_file += 1
                    except ExcludedRecord as error:
                        bad.append(BadLine(path, number, str(error), excluded=True))
                    except ValueError as error:
                        if not skip_bad:
                            raise TrajectoryInputError(path, number, str(error)) from None
                        bad.append(BadLine(path, number, str(error)))
        except (OSError, UnicodeDecodeError) as error:
            raise TrajectoryInputError(path, None, f"cannot read: {error}") from None
        if good_in_file == 0:
            message = "no valid trajectory" if nonblank_in_file else "empty file"
            raise TrajectoryInputError(path, None, message)
    return shaping.as_trajectories(rows), bad


def build_scale_table(
    trajectories: Any,
    quantile: float = 0.9,
    failure_threshold: float = 1.0,
    suppression_factor: float = 2.0,
    long_low_factor: float = 0.5,
) -> dict[str, dict[str, Any]]:
    """The frozen scale table of a profiling run.

    ``{family: {"D", "D_prime", "rule", "quantile", "n", "n_success", "n_failure", "mean_turns",
    "mean_reward_fdr", "max_failure_reward_fdr"}}``: ``D`` from `shaping.family_scales`, ``D_prime``
    from `shaping.recalibrate`, ``rule`` the rule that fired, rewards under FDR with ``D``
    (``max_failure_reward_fdr`` is None for a family without failures).
    """
    trajectories = shaping.as_trajectories(trajectories)
    if not trajectories.families:
        raise ValueError("build_scale_table: no trajectories")
    scales = shaping.family_scales(trajectories.families, trajectories.matched, quantile)
    rules = shaping.recalibration_rules(
        trajectories, scales, failure_threshold=failure_threshold
    )
    primes = shaping.recalibrate(
        trajectories,
        scales,
        failure_threshold=failure_threshold,
        suppression_factor=suppression_factor,
        long_low_factor=long_low_factor,
    )
    names = np.asarray(trajectories.families, dtype=object)
    scale_per_trajectory = np.asarray([scales[f] for f in trajectories.families], np.float32)
    reward = np.asarray(shaping.fdr(trajectories.matched, scale_per_trajectory))
    table = {}
    for family in sorted(scales):
        member = names == family
        failure = member & ~trajectories.strict_pass
        table[family] = {
            "D": scales[family],
            "D_prime": primes[family],
            "rule": rules[family],
            "quantile": float(quantile),
            "n": int(member.sum()),
            "n_success": int((member & trajectories.strict_pass).sum()),
            "n_failure": int(failure.sum()),
            "mean_turns": float(trajectories.turns[member].mean()),
            "mean_reward_fdr": float(reward[member].mean()),
            "max_failure_reward_fdr": float(reward[failure].max()) if failure.any() else None,
        }
    return table


def dumps_scale_table(table: Mapping[str, Mapping[str, Any]]) -> str:
    """Deterministic JSON text of a scale table (sorted keys, fixed indent, trailing newline)."""
    return json.dumps(table, sort_keys=True, indent=2, allow_nan=False) + "\n"


def load_scale_table(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read and check a scale table: ``{family: {"D": >0, "D_prime": >0, ...}}``."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
    except (OSError, UnicodeDecodeError) as error:
        raise TrajectoryInputError(path, None, f"cannot read scale table: {error}") from None
    except json.JSONDecodeError as error:
        raise TrajectoryInputError(path, error.lineno, f"not valid JSON ({error.msg})") from None
    if not isinstance(table, dict) or not table:
        raise TrajectoryInputError(path, None, "scale table must be a non-empty JSON object")
    for family, entry in table.items():
        if not isinstance(entry, dict):
            raise TrajectoryInputError(path, None, f"family {family!r}: expected an object")
        for key in ("D", "D_prime"):
            value = entry.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TrajectoryInputError(
                    path, None, f"family {family!r}: '{key}' must be a number, got {value!r}"
                )
            if not math.isfinite(value) or value <= 0:
                raise TrajectoryInputError(
                    path, None, f"family {family!r}: '{key}' must be finite and > 0, got {value!r}"
                )
    return table


def format_scale_table(table: Mapping[str, Mapping[str, Any]]) -> str:
    """Human-readable summary: one row per family."""
    header = f"{'family':<28} {'n':>6} {'fail':>6} {'D':>8} {'D_prime':>8}  rule"
    rows = [header, "-" * len(header)]
    for family, entry in sorted(table.items()):
        rows.append(
            f"{family:<28} {entry['n']:>6} {entry['n_failure']:>6} {entry['D']:>8.3f} "
            f"{entry['D_prime']:>8.3f}  {entry['rule']}"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tr.rewards.profile",
        description="Profile trajectories per family and write the frozen scale table (D, D').",
    )
    parser.add_argument("files", nargs="+", help="JSONL trajectory files")
    parser.add_argument("--out", help="write the scale table here (default: JSON to stdout)")
    parser.add_argument("--quantile", type=float, default=0.9, help="q of D_f = Q_q(N|f)")
    parser.add_argument(
        "--failure-threshold", type=float, default=1.0, help="R_FDR of a failure that suppresses"
    )
    parser.add_argument("--skip-bad", action="store_true", help="report and skip bad lines")
    args = parser.parse_args(argv)
    if not 0.0 <= args.quantile <= 1.0:
        parser.error(f"--quantile must be in [0, 1], got {args.quantile}")
    try:
        trajectories, bad = read_trajectories(args.files, skip_bad=args.skip_bad)
    except TrajectoryInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for line in bad:
        print(f"{'excluded' if line.excluded else 'skipped'} {line}", file=sys.stderr)
    table = build_scale_table(
        trajectories, args.quantile, failure_threshold=args.failure_threshold
    )
    text = dumps_scale_table(table)
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as error:
            print(f"error: {args.out}: cannot write: {error}", file=sys.stderr)
            return 2
        print(format_scale_table(table))
        n = len(trajectories.families)
        print(f"wrote {args.out} ({len(table)} families, {n} trajectories)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
