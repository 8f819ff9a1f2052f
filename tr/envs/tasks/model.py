"""The task model: what every loader produces and every runner consumes."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

TIERS = ("easy", "medium", "hard", "extreme")
LAYOUTS = ("tr", "harbor", "tb1")
VERIFIER_KINDS = ("pytest", "reward_file", "output")
CHECK_RUNNERS = ("pytest", "stdlib")   # what runs a pytest-kind verifier's files
TASK_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_MAX_TURNS = 50
DEFAULT_VERIFIER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a task directory: the file, the field (if any), what is wrong."""

    file: str
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.message}"


class TaskError(Exception):
    """A task directory that cannot be used; carries every problem found."""

    def __init__(self, task_dir: Path | str, problems: list[Problem]):
        self.task_dir = Path(task_dir)
        self.problems = list(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"invalid task {self.task_dir}:\n{lines}")


@dataclass(frozen=True)
class Budgets:
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    max_turns: int = DEFAULT_MAX_TURNS
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S


@dataclass(frozen=True)
class Environment:
    """How the initial state is laid down.

    kind: 'setup' (files dir and/or setup script), 'dockerfile' (interpreted locally, built for
    Docker), 'image' (a prebuilt image only; Docker backend), or 'none'.
    """

    kind: str = "none"
    files_dir: Path | None = None
    setup_script: Path | None = None
    dockerfile: Path | None = None
    docker_image: str | None = None
    workdir: str = "/app"
    network: bool | None = None      # the agent's runtime network (None: the backend's default, off)
    cpus: float | None = None        # Harbor [environment] limits (None: the sandbox default)
    memory_mb: int | None = None
    storage_mb: int | None = None
    build_timeout_s: float | None = None


@dataclass(frozen=True)
class VerifierSpec:
    """What to run after the agent: pytest files, or a script that writes a reward file."""

    kind: str  # 'pytest' | 'reward_file' | 'output' (a TB1 script's printed pytest-style summary)
    test_files: tuple[str, ...] = ()  # relative to tests_dir (pytest)
    script: str | None = None  # relative to tests_dir (reward_file)
    final_gate: str | None = None
    required: tuple[str, ...] | None = None
    note: str = ""  # e.g. which lines of run-tests.sh tr serves itself
    script_text: str | None = None  # the task's test script as run (testscript.rewrite), if any
    env: tuple[tuple[str, str], ...] = ()  # Harbor [verifier].env: exported for the verifier
    runner: str = "pytest"  # pytest | stdlib (tr/envs/checkrun.py: same checks, no start-up)
    # the tests talk to a server on the sandbox's own host ("file (localhost:8080)", ...): where
    # the backend can, they run beside the agent's live processes (protected.run_verifier's
    # beside_agent), as the TB1/Harbor harnesses keep them; set by those layouts' loaders
    servers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    id: str
    family: str
    tier: str
    instruction: str
    environment: Environment
    tests_dir: Path
    verifier: VerifierSpec
    budgets: Budgets
    solution: Path | None
    source_dir: Path
    layout: str
    partial: Path | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)
    solution_env: tuple[tuple[str, str], ...] = ()   # Harbor [solution].env

    @property
    def verifier_kind(self) -> str:
        return self.verifier.kind


# ---------------------------------------------------------------- solution scripts as turns


def split_turns(script: str) -> list[str]:
    """Split a tr solution script into turns: blocks separated by blank lines.

    Blocks made only of comments (including a `#!` line) are dropped.
    """
    turns, block = [], []
    for line in script.splitlines() + [""]:
        if line.strip():
            block.append(line.rstrip())
            continue
        if block and any(not b.lstrip().startswith("#") for b in block):
            turns.append("\n".join(block))
        block = []
    return turns


def script_interpreter(script: str) -> list[str]:
    """The command that runs a whole script file: its shebang, or bash when it has none."""
    first = script.splitlines()[0] if script else ""
    if first.startswith("#!"):
        words = first[2:].split()
        if words:
            return words
    return ["bash"]


# ---------------------------------------------------------------- static look at test files


def _is_testcase(node: ast.ClassDef) -> bool:
    """A class pytest collects whatever its name: it subclasses `unittest.TestCase` (or a base
    whose name ends in `TestCase`, e.g. `IsolatedAsyncioTestCase`)."""
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        if name.endswith("TestCase"):
            return True
    return False


def test_functions(path: Path) -> list[str]:
    """Names of the test functions pytest would collect from one file (static, via ast).

    Top-level `def test_*`, and methods `test_*` of top-level `class Test*` or of any top-level
    `unittest.TestCase` subclass (as `Class::test_x`).
    Raises SyntaxError when the file does not parse.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or _is_testcase(node)):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                    names.append(f"{node.name}::{sub.name}")
    return names
