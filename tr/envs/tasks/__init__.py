"""Tasks: the task model, loaders for the tr / Harbor / Terminal-Bench 1 layouts, and the runner.

`load_task(path)` detects the layout; `load_suite()` loads the built-in suite (tr/envs/suite).
`sandbox_config(task)`, `prepare(task, sandbox)`, `run_attempt(...)`, `verify(task, sandbox)`
run one (`run_task` all of them). The tr layout and the verifier semantics are documented in
LAYOUT_TR.md next to this file.
"""

from tr.envs.tasks.loader import SUITE_DIR, detect_layout, load_suite, load_task, validate_task
from tr.envs.tasks.model import (
    TIERS, Budgets, Environment, Problem, Task, TaskError, VerifierSpec, split_turns,
)
from tr.envs.tasks.runner import (
    NeedsDocker, TaskEnvironmentError, attempt_turns, prepare, run_attempt, run_task,
    sandbox_config, verify,
)

__all__ = [
    "SUITE_DIR", "TIERS", "Budgets", "Environment", "NeedsDocker", "Problem", "Task", "TaskError",
    "TaskEnvironmentError", "VerifierSpec", "attempt_turns", "detect_layout", "load_suite",
    "load_task", "prepare", "run_attempt", "run_task", "sandbox_config", "split_turns",
    "validate_task", "verify",
]
