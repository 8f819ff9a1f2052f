"""Loader for the two task.toml layouts: Harbor / Terminal-Bench 2, and tr's own (Harbor + tier,
family, setup script, partial attempt, final gate; see LAYOUT_TR.md)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tr.envs.tasks import checks
from tr.envs.tasks.fields import MISSING, FieldReader, read_text
from tr.envs.tasks.model import (
    DEFAULT_AGENT_TIMEOUT_S, DEFAULT_MAX_TURNS, DEFAULT_VERIFIER_TIMEOUT_S, TASK_ID_RE, Budgets,
    CHECK_RUNNERS, Environment, Problem, Task, VerifierSpec,
)

TR_KEYS = {
    "": {"version", "schema"},
    "metadata": {"id", "family", "tier", "tags", "author", "author_name", "author_email",
                 "description"},
    "agent": {"timeout_sec", "max_turns"},
    "verifier": {"timeout_sec", "final_gate", "required", "runner"},
    "environment": {"setup", "dockerfile", "docker_image", "workdir", "allow_internet", "cpus",
                    "memory", "memory_mb", "storage", "storage_mb", "build_timeout_sec"},
}


def read_toml(task_dir: Path, problems: list[Problem]) -> dict | None:
    text = read_text(task_dir / "task.toml", "task.toml", problems, what="task metadata")
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problems.append(Problem("task.toml", None, f"cannot parse TOML: {exc}"))
        return None


def is_tr_layout(data: dict) -> bool:
    metadata = data.get("metadata")
    return isinstance(metadata, dict) and "tier" in metadata


def load(task_dir: Path, *, deep: bool = False) -> tuple[Task | None, list[Problem]]:
    problems: list[Problem] = []
    data = read_toml(task_dir, problems)
    if data is None:
        return None, problems
    layout = "tr" if is_tr_layout(data) else "harbor"
    f = FieldReader("task.toml", data, problems)
    for name in ("metadata", "agent", "verifier", "environment"):
        f.table(name)

    if layout == "tr":
        f.unknown_keys(TR_KEYS)
        task_id = f.string("metadata.id", default=task_dir.name)
        if task_id is not None and task_id != task_dir.name:
            f.problem("metadata.id", f"{task_id!r} differs from the directory name {task_dir.name!r}")
        family = f.string("metadata.family", required=True) or "uncategorized"
        tier = f.tier("metadata.tier")
    else:
        task_id = task_dir.name
        family = f.string("metadata.category", default="uncategorized") or "uncategorized"
        tier = f.tier("metadata.difficulty", default="medium")
    if not TASK_ID_RE.match(task_dir.name):
        problems.append(Problem(str(task_dir.name), None, "task id (the directory name) must match "
                                f"{TASK_ID_RE.pattern}"))
    tags = f.string_list("metadata.tags") or ()
    if layout == "tr" and family and not TASK_ID_RE.match(family):
        f.problem("metadata.family", f"{family!r} must be kebab-case ({TASK_ID_RE.pattern})")

    budgets = Budgets(
        agent_timeout_s=f.positive_number("agent.timeout_sec", DEFAULT_AGENT_TIMEOUT_S),
        max_turns=f.positive_int("agent.max_turns", DEFAULT_MAX_TURNS),
        verifier_timeout_s=f.positive_number("verifier.timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S),
    )

    instruction = read_text(task_dir / "instruction.md", "instruction.md", problems,
                            what="the task instruction")
    if instruction is not None and not instruction.strip():
        problems.append(Problem("instruction.md", None, "is empty"))

    environment = _environment(task_dir, f, layout)
    if deep and environment.setup_script is not None and environment.setup_script.is_file():
        rel = environment.setup_script.relative_to(task_dir).as_posix()
        script = read_text(environment.setup_script, rel, problems, what="setup script")
        if script is not None:
            problems.extend(checks.solution_problems(environment.setup_script, rel, script,
                                                     as_turns=False))
    spec = _verifier(task_dir, f, layout, problems, deep=deep)
    solution = _solution(task_dir, "solution/solve.sh", problems, as_turns=layout == "tr", deep=deep)
    partial = None
    if layout == "tr":
        partial = _solution(task_dir, "solution/partial.sh", problems, as_turns=True, deep=deep)

    if problems:
        return None, problems
    return Task(
        id=task_id, family=family, tier=tier, instruction=instruction, environment=environment,
        tests_dir=task_dir / "tests", verifier=spec, budgets=budgets, solution=solution,
        source_dir=task_dir, layout=layout, partial=partial, tags=tags,
        solution_env=f.string_table("solution.env") if layout == "harbor" else (),
    ), problems


def _environment(task_dir: Path, f: FieldReader, layout: str) -> Environment:
    workdir = f.string("environment.workdir", default="/app") or "/app"
    if not workdir.startswith("/"):
        f.problem("environment.workdir", f"must be an absolute path, got {workdir!r}")
    image = f.string("environment.docker_image", default=None)
    limits = _limits(f)
    setup_rel = f.string("environment.setup", default=None)
    dockerfile_rel = f.string("environment.dockerfile", default=None)
    if setup_rel and dockerfile_rel:
        f.problem("environment", "give either setup or dockerfile, not both")
    for field, rel in (("environment.setup", setup_rel), ("environment.dockerfile", dockerfile_rel)):
        if rel is not None and not _inside(task_dir, rel):
            f.problem(field, f"{rel!r} points outside the task directory")
        elif rel is not None and not (task_dir / rel).is_file():
            f.problem(field, f"{rel!r} does not exist")
    files_dir = task_dir / "environment" / "files"
    files = files_dir if (layout == "tr" and files_dir.is_dir()) else None
    if setup_rel is None and dockerfile_rel is None:
        if (task_dir / "environment" / "setup.sh").is_file():
            setup_rel = "environment/setup.sh"
        elif (task_dir / "environment" / "Dockerfile").is_file():
            dockerfile_rel = "environment/Dockerfile"
    if dockerfile_rel is not None:
        return Environment(kind="dockerfile", dockerfile=task_dir / dockerfile_rel,
                           docker_image=image, workdir=workdir, **limits)
    if setup_rel is not None or files is not None:
        return Environment(kind="setup", files_dir=files,
                           setup_script=task_dir / setup_rel if setup_rel else None,
                           docker_image=image, workdir=workdir, **limits)
    if image is not None:
        return Environment(kind="image", docker_image=image, workdir=workdir, **limits)
    return Environment(kind="none", workdir=workdir, **limits)


_SIZE = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _megabytes(f: FieldReader, name: str) -> int | None:
    """`<name>_mb` (an integer) or `<name>` ("2G", "512M", "1024"): megabytes, or None."""
    mb = f.raw(f"environment.{name}_mb")
    if mb is not MISSING:
        return f.positive_int(f"environment.{name}_mb", 0) or None
    text = f.raw(f"environment.{name}")
    if text is MISSING or text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text), re.I)
    if not match or float(match.group(1)) <= 0:
        f.problem(f"environment.{name}", f"expected a size such as \"2G\" or \"512M\", got {text!r}")
        return None
    return max(1, int(float(match.group(1)) * _SIZE[match.group(2).lower()]))


def _limits(f: FieldReader) -> dict:
    """Harbor's [environment] resources: allow_internet, cpus, memory(_mb), storage(_mb),
    build_timeout_sec."""
    out: dict = {}
    internet = f.raw("environment.allow_internet")
    if internet is not MISSING:
        if isinstance(internet, bool):
            out["network"] = internet
        else:
            f.problem("environment.allow_internet", f"expected true or false, got {internet!r}")
    cpus = f.raw("environment.cpus")
    if cpus is not MISSING:
        out["cpus"] = f.positive_number("environment.cpus", 1.0)
    out["memory_mb"] = _megabytes(f, "memory")
    out["storage_mb"] = _megabytes(f, "storage")
    if f.raw("environment.build_timeout_sec") is not MISSING:
        out["build_timeout_s"] = f.positive_number("environment.build_timeout_sec", 600.0)
    return out


def _inside(task_dir: Path, rel: str) -> bool:
    try:
        (task_dir / rel).resolve().relative_to(task_dir.resolve())
    except ValueError:
        return False
    return True


def _verifier(task_dir: Path, f: FieldReader, layout: str, problems: list[Problem], *,
              deep: bool) -> VerifierSpec | None:
    tests_dir = task_dir / "tests"
    final_gate = f.string("verifier.final_gate", default=None)
    required = f.string_list("verifier.required")
    if not tests_dir.is_dir():
        problems.append(Problem("tests/", None, "missing: the task has no tests directory"))
        return None
    test_files = checks.find_test_files(tests_dir)
    test_sh = tests_dir / "test.sh"
    if layout == "harbor" and test_sh.is_file():
        script = read_text(test_sh, "tests/test.sh", problems)
        if script is None:
            return None
        if checks.runs_pytest(script) and test_files:
            spec = checks.pytest_spec_from_script(script, "tests/test.sh", tests_dir)
            unserved = checks.unserved_pytest_problem(spec, "tests/test.sh")
            if unserved is not None:
                problems.append(unserved)
                return None
        else:
            found = checks.local_server_checks(tests_dir, ["test.sh", *test_files])
            spec = VerifierSpec(kind="reward_file", script="test.sh",
                                env=f.string_table("verifier.env"),
                                servers=checks.server_names(found))
            if deep:
                problems.extend(checks.solution_problems(test_sh, "tests/test.sh", script,
                                                         as_turns=False))
            return spec
    elif test_files:
        # Harbor's harness keeps the agent's processes alive while the tests run; tr's own
        # layout ends them (its tasks leave no servers to test)
        found = checks.local_server_checks(tests_dir, test_files) if layout == "harbor" else {}
        spec = VerifierSpec(kind="pytest", test_files=tuple(test_files),
                            servers=checks.server_names(found))
    else:
        expected = "test_*.py files" + (" or a test.sh" if layout == "harbor" else "")
        problems.append(Problem("tests/", None, f"no tests: expected {expected}"))
        return None
    runner = f.string("verifier.runner", default="pytest") or "pytest"
    if runner not in CHECK_RUNNERS:
        f.problem("verifier.runner", f"{runner!r} is not a check runner; expected one of "
                  f"{CHECK_RUNNERS}")
    spec = VerifierSpec(kind=spec.kind, test_files=spec.test_files, final_gate=final_gate,
                        required=required, note=spec.note, script_text=spec.script_text,
                        env=f.string_table("verifier.env") if layout == "harbor" else (),
                        runner=runner, servers=spec.servers if layout == "harbor" else ())
    file_problems, names = checks.test_file_problems(tests_dir, spec.test_files, "tests")
    problems.extend(file_problems)
    if not file_problems:
        problems.extend(checks.gate_problems(spec, names))
    return spec


def _solution(task_dir: Path, rel: str, problems: list[Problem], *, as_turns: bool,
              deep: bool) -> Path | None:
    path = task_dir / rel
    if not path.exists():
        return None
    text = read_text(path, rel, problems, what="solution script")
    if text is None:
        return None
    problems.extend(checks.solution_problems(path, rel, text, as_turns=as_turns, syntax=deep))
    return path
