"""Reading typed fields out of parsed TOML/YAML while collecting every problem (never raising)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from tr.envs.tasks.model import TIERS, Problem

MISSING = object()


class FieldReader:
    """Typed access to a nested mapping; each bad field becomes a Problem naming file and field."""

    def __init__(self, file: str, data: dict, problems: list[Problem]):
        self.file = file
        self.data = data
        self.problems = problems

    def problem(self, field: str | None, message: str) -> None:
        self.problems.append(Problem(self.file, field, message))

    def raw(self, dotted: str):
        node = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def table(self, name: str) -> dict:
        value = self.raw(name)
        if value is MISSING:
            return {}
        if not isinstance(value, dict):
            self.problem(name, f"expected a table, got {type(value).__name__}")
            return {}
        return value

    def string(self, dotted: str, default=MISSING, *, required: bool = False):
        value = self.raw(dotted)
        if value is MISSING or value is None:
            if required:
                self.problem(dotted, "missing (required)")
            return None if default is MISSING else default
        if not isinstance(value, str):
            self.problem(dotted, f"expected a string, got {type(value).__name__} {value!r}")
            return None if default is MISSING else default
        if required and not value.strip():
            self.problem(dotted, "is empty")
        return value

    def positive_number(self, dotted: str, default: float) -> float:
        value = self.raw(dotted)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.problem(dotted, f"expected a positive number of seconds, got {value!r}")
            return default
        if not math.isfinite(value) or value <= 0:
            self.problem(dotted, f"must be a positive number, got {value!r}")
            return default
        return float(value)

    def positive_int(self, dotted: str, default: int) -> int:
        value = self.raw(dotted)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(dotted, f"expected a positive integer, got {value!r}")
            return default
        if value <= 0:
            self.problem(dotted, f"must be a positive integer, got {value!r}")
            return default
        return value

    def string_list(self, dotted: str) -> tuple[str, ...] | None:
        value = self.raw(dotted)
        if value is MISSING or value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(dotted, f"expected a list of strings, got {value!r}")
            return None
        return tuple(value)

    def string_table(self, dotted: str) -> tuple[tuple[str, str], ...]:
        """A table of environment variables: names to strings (numbers and booleans as text)."""
        value = self.raw(dotted)
        if value is MISSING or value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(dotted, f"expected a table of NAME = \"value\", got {value!r}")
            return ()
        out = []
        for name, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                self.problem(f"{dotted}.{name}", "is not a valid environment variable name")
            elif isinstance(item, (dict, list)):
                self.problem(f"{dotted}.{name}", f"expected a string, got {item!r}")
            else:
                out.append((name, str(item).lower() if isinstance(item, bool) else str(item)))
        return tuple(out)

    def tier(self, dotted: str, default=MISSING) -> str:
        value = self.string(dotted, default=default, required=default is MISSING)
        if value is None:
            return "medium"
        tier = value.strip().lower()
        if tier not in TIERS:
            self.problem(dotted, f"unknown tier {value!r}; expected one of {', '.join(TIERS)}")
            return "medium"
        return tier

    def unknown_keys(self, allowed: dict[str, set[str]]) -> None:
        """Flag keys outside `allowed` ({table: keys}; table "" = top level)."""
        for key, value in self.data.items():
            if key in allowed and isinstance(value, dict) and key != "":
                for sub in value:
                    if sub not in allowed[key]:
                        self.problem(f"{key}.{sub}", f"unknown key; allowed: {', '.join(sorted(allowed[key]))}")
            elif key not in allowed and key not in allowed.get("", set()):
                self.problem(key, "unknown key")


def read_text(path: Path, file: str, problems: list[Problem], *, what: str = "file") -> str | None:
    """Read a UTF-8 text file, recording a problem (missing, not a file, not UTF-8) instead of raising."""
    if not path.exists():
        problems.append(Problem(file, None, f"missing ({what})"))
        return None
    if not path.is_file():
        problems.append(Problem(file, None, f"is not a regular file ({what})"))
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        problems.append(Problem(file, None, f"is not valid UTF-8 text (byte {exc.start})"))
    except OSError as exc:
        problems.append(Problem(file, None, f"cannot be read: {exc.strerror}"))
    return None
