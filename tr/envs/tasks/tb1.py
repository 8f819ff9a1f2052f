"""Loader for Terminal-Bench 1 tasks: task.yaml, solution.sh, run-tests.sh, tests/, Dockerfile."""

from __future__ import annotations

from pathlib import Path

import yaml

from tr.envs.tasks import checks
from tr.envs.tasks.fields import FieldReader, read_text
from tr.envs.tasks.model import (
    DEFAULT_AGENT_TIMEOUT_S, DEFAULT_MAX_TURNS, DEFAULT_VERIFIER_TIMEOUT_S, TASK_ID_RE, Budgets,
    Environment, Problem, Task, VerifierSpec,
)
from tr.envs.tasks import testscript


def _instruction(f: FieldReader) -> str | None:
    """`instruction`, or (older TB1) the `base` entry of `descriptions`."""
    value = f.data.get("instruction")
    if value is None and isinstance(f.data.get("descriptions"), list):
        for entry in f.data["descriptions"]:
            if isinstance(entry, dict) and entry.get("key") == "base":
                value = entry.get("description")
        if value is None:
            f.problem("descriptions", "has no entry with key 'base'")
            return None
    if value is None:
        f.problem("instruction", "missing (required)")
        return None
    if not isinstance(value, str):
        f.problem("instruction", f"expected a string, got {type(value).__name__}")
        return None
    if not value.strip():
        f.problem("instruction", "is empty")
        return None
    return value


def load(task_dir: Path, *, deep: bool = False) -> tuple[Task | None, list[Problem]]:
    problems: list[Problem] = []
    text = read_text(task_dir / "task.yaml", "task.yaml", problems, what="task metadata")
    if text is None:
        return None, problems
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problems.append(Problem("task.yaml", None, f"cannot parse YAML: {exc}".replace("\n", " ")))
        return None, problems
    if not isinstance(data, dict):
        problems.append(Problem("task.yaml", None, f"expected a mapping at top level, got "
                                f"{type(data).__name__}"))
        return None, problems
    f = FieldReader("task.yaml", data, problems)
    instruction = _instruction(f)
    tier = f.tier("difficulty", default="medium")
    family = f.string("category", default="uncategorized") or "uncategorized"
    tags = f.string_list("tags") or ()
    budgets = Budgets(
        agent_timeout_s=f.positive_number("max_agent_timeout_sec", DEFAULT_AGENT_TIMEOUT_S),
        max_turns=DEFAULT_MAX_TURNS,
        verifier_timeout_s=f.positive_number("max_test_timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S),
    )
    parser = f.string("parser_name", default="pytest")
    if parser is not None and parser != "pytest":
        f.problem("parser_name", f"parser {parser!r} is not supported (only pytest)")
    if not TASK_ID_RE.match(task_dir.name):
        problems.append(Problem(task_dir.name, None, "task id (the directory name) must match "
                                f"{TASK_ID_RE.pattern}"))

    spec = _verifier(task_dir, problems)

    dockerfile = task_dir / "Dockerfile"
    compose = next((p for p in (task_dir / "docker-compose.yaml", task_dir / "docker-compose.yml")
                    if p.is_file()), None)
    if compose is not None:      # its one service's build (a root Dockerfile comes first)
        dockerfile = compose_dockerfile(task_dir, compose, problems,
                                        dockerfile if dockerfile.is_file() else None)
        environment = (Environment(kind="dockerfile", dockerfile=dockerfile) if dockerfile
                       else Environment())
    elif dockerfile.is_file():
        environment = Environment(kind="dockerfile", dockerfile=dockerfile)
    else:
        environment = Environment(kind="none")

    solution = None
    solution_path = task_dir / "solution.sh"
    if solution_path.exists():
        script = read_text(solution_path, "solution.sh", problems, what="solution script")
        if script is not None:
            problems.extend(checks.solution_problems(solution_path, "solution.sh", script,
                                                     as_turns=False, syntax=deep))
            solution = solution_path
    elif (task_dir / "solution.yaml").exists():
        solution = task_dir / "solution.yaml"
        text = read_text(solution, "solution.yaml", problems, what="solution command list")
        if text is not None:
            _, yaml_problems = solution_commands(text)
            problems.extend(yaml_problems)

    if problems:
        return None, problems
    if environment.kind == "dockerfile":
        spec = checks.with_image_installs(spec, task_dir / "tests", environment.dockerfile)
    return Task(
        id=task_dir.name, family=family, tier=tier, instruction=instruction,
        environment=environment, tests_dir=task_dir / "tests", verifier=spec, budgets=budgets,
        solution=solution, source_dir=task_dir, layout="tb1", tags=tags,
    ), problems


def compose_dockerfile(task_dir: Path, compose: Path, problems: list[Problem],
                       root_dockerfile: Path | None = None) -> Path | None:
    """The Dockerfile of a TB1 task's one container: ``root_dockerfile`` (next to task.yaml) when
    given, else the one service's build (``docker-compose.yaml``: ``build: {context: client,
    dockerfile: Dockerfile}`` or ``build: client``), as TB1's harness builds it; its folder is
    the build context.  More than one service (the tests talk to a second container) is refused
    by name."""
    name = compose.name
    text = read_text(compose, name, problems, what="container description")
    if text is None:
        return None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problems.append(Problem(name, None, f"cannot parse YAML: {exc}".replace("\n", " ")))
        return None
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not services:
        problems.append(Problem(name, "services", "expected a mapping of services (and no "
                                "Dockerfile next to task.yaml)"))
        return None
    if len(services) > 1:
        problems.append(Problem(name, "services", f"multi-container tasks are not supported: "
                                f"services {sorted(services)} (the tests need the other "
                                "containers running); give one service or a Dockerfile"))
        return None
    if root_dockerfile is not None:
        return root_dockerfile
    (service, spec), = services.items()
    build = spec.get("build") if isinstance(spec, dict) else None
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict) or not isinstance(build.get("context", "."), str) \
            or not isinstance(build.get("dockerfile", "Dockerfile"), str):
        problems.append(Problem(name, f"services.{service}.build", "expected a build context "
                                f"folder (and a Dockerfile name), got {build!r}; a service "
                                "that only names an image needs a Dockerfile"))
        return None
    root = task_dir.resolve()
    context = (task_dir / build.get("context", ".")).resolve()
    path = (context / build.get("dockerfile", "Dockerfile")).resolve()
    where = f"services.{service}.build"
    if not context.is_relative_to(root) or not path.is_relative_to(root):
        problems.append(Problem(name, where, f"the build context {build!r} leaves the task "
                                "folder"))
        return None
    if path.parent != context:
        problems.append(Problem(name, where, f"a Dockerfile outside its build context is not "
                                f"supported ({build!r})"))
        return None
    if not path.is_file():
        problems.append(Problem(name, where, f"{path.relative_to(root)}: missing"))
        return None
    return task_dir / path.relative_to(root)


def solution_commands(text: str) -> tuple[list[str], list[Problem]]:
    """TB1 `solution.yaml`: a list of `{command: str, min_timeout_sec, block, append_enter}`;
    each command is one turn (typed into the terminal, so it runs in the agent's shell)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [], [Problem("solution.yaml", None, f"cannot parse YAML: {exc}".replace("\n", " "))]
    if not isinstance(data, list) or not data:
        return [], [Problem("solution.yaml", None, "expected a non-empty list of "
                            "{command: ...} entries")]
    commands, problems = [], []
    for index, entry in enumerate(data):
        command = entry.get("command") if isinstance(entry, dict) else None
        if not isinstance(command, str) or not command.strip():
            problems.append(Problem("solution.yaml", f"[{index}].command",
                                    f"expected a non-empty string, got {command!r}"))
            continue
        commands.append(command.strip())
    return commands, problems


def _verifier(task_dir: Path, problems: list[Problem]) -> VerifierSpec | None:
    tests_dir = task_dir / "tests"
    run_tests = task_dir / "run-tests.sh"
    if not tests_dir.is_dir():
        problems.append(Problem("tests/", None, "missing: the task has no tests directory"))
        return None
    if not run_tests.exists():
        problems.append(Problem("run-tests.sh", None, "missing (it says how the tests run)"))
        return None
    script = read_text(run_tests, "run-tests.sh", problems)
    if script is None:
        return None
    if not checks.runs_pytest_or_harness(script):

        if "short test summary info" not in script:
            problems.append(Problem("run-tests.sh", None, "does not run pytest nor print a "
                                    "pytest-style 'short test summary info'; Terminal-Bench 1's "
                                    "pytest parser would find no result"))
            return None
        return VerifierSpec(kind="output", script_text=testscript.rewrite(
            script, junit="/logs/verifier/junit.xml").text, note="run-tests.sh runs as written; "
            "its printed 'short test summary info' is the result (Terminal-Bench 1's parser)")
    spec = checks.pytest_spec_from_script(script, "run-tests.sh", tests_dir)
    unserved = checks.unserved_pytest_problem(spec, "run-tests.sh")
    if unserved is not None:
        problems.append(unserved)
        return None
    if not spec.test_files:
        problems.append(Problem("tests/", None, "no tests: expected test_*.py files"))
        return None
    file_problems, _ = checks.test_file_problems(tests_dir, spec.test_files, "tests")
    problems.extend(file_problems)
    return spec
