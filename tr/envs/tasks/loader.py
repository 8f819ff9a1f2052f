"""Layout detection, loading and validation of task directories."""

from __future__ import annotations

from pathlib import Path

from tr.envs.tasks import harbor, tb1
from tr.envs.tasks.model import Problem, Task, TaskError

SUITE_DIR = Path(__file__).resolve().parent.parent / "suite"


def detect_layout(task_dir: Path) -> str | None:
    """'tb1' (task.yaml), 'tr' (task.toml with [metadata] tier), 'harbor' (task.toml), or None."""
    if (task_dir / "task.yaml").is_file():
        return "tb1"
    if (task_dir / "task.toml").is_file():
        problems: list[Problem] = []
        data = harbor.read_toml(task_dir, problems)
        return "tr" if data is not None and harbor.is_tr_layout(data) else "harbor"
    return None


def _load(task_dir: Path, deep: bool) -> tuple[Task | None, list[Problem]]:
    task_dir = Path(task_dir)
    if not task_dir.exists():
        return None, [Problem(str(task_dir), None, "does not exist")]
    if not task_dir.is_dir():
        return None, [Problem(str(task_dir), None, "is not a directory")]
    if (task_dir / "task.yaml").is_file() and (task_dir / "task.toml").is_file():
        return None, [Problem("task.toml", None, "both task.toml and task.yaml exist; the layout "
                              "is ambiguous (keep one)")]
    layout = detect_layout(task_dir)
    if layout is None:
        return None, [Problem(str(task_dir), None, "not a task directory: no task.toml (tr / Harbor "
                              "layout) or task.yaml (Terminal-Bench 1 layout)")]
    loader = tb1 if layout == "tb1" else harbor
    return loader.load(task_dir, deep=deep)


def load_task(task_dir: Path | str) -> Task:
    """Load one task directory, layout detected; TaskError listing every problem if it is bad."""
    task, problems = _load(Path(task_dir), deep=False)
    if task is None:
        raise TaskError(task_dir, problems)
    return task


def validate_task(task_dir: Path | str) -> list[Problem]:
    """Every problem of a task directory, including shell-syntax checks of its scripts."""
    _, problems = _load(Path(task_dir), deep=True)
    return problems


def task_dirs(root: Path | str) -> list[Path]:
    """The task directories directly under `root` (sorted), or [root] if it is itself a task."""
    root = Path(root)
    if detect_layout(root) is not None:
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def load_suite(path: Path | str | None = None) -> list[Task]:
    """Every task under `path` (default: the built-in suite), sorted by id."""
    root = SUITE_DIR if path is None else Path(path)
    if not root.is_dir():
        raise TaskError(root, [Problem(str(root), None, "suite directory does not exist")])
    tasks = [load_task(d) for d in task_dirs(root)]
    return sorted(tasks, key=lambda t: t.id)
