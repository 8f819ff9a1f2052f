"""Tasks: the task model, loaders for the tr / Harbor / Terminal-Bench 1 layouts, and the runner.

`load_task(path)` detects the layout; `load_suite()` loads the built-in suite (tr/envs/suite).
The tr layout and the verifier semantics are documented in LAYOUT_TR.md next to this file.
"""

from tr.envs.tasks.loader import SUITE_DIR, detect_layout, load_suite, load_task, validate_task
from tr.envs.tasks.model import (
    TIERS, Budgets, Environment, Problem, Task, TaskError, VerifierSpec, split_turns,
)

__all__ = [
    "SUITE_DIR", "TIERS", "Budgets", "Environment", "Problem", "Task", "TaskError", "VerifierSpec",
    "detect_layout", "load_suite", "load_task", "split_turns", "validate_task",
]
