"""Running a task in a sandbox: lay the environment down, play an attempt, run the verifier.

    backend = get_backend("docker")               # tr.envs.backends: what differs per backend
    config = sandbox_config(task, backend)       # workdir / env / image (from the Dockerfile)
    with backend.make(config) as box:
        prepare(task, box)                        # files + setup.sh, or the Dockerfile's steps
        run_attempt(task, box, "solution")        # the reference solution, turn by turn
        result = verify(task, box)                # protected verifier -> VerifierResult

`run_task(task, attempt, backend)` does all four.
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
import time
from pathlib import Path

from tr.envs import protected
from tr.envs import verifier as vr
from tr.envs.backends import get_backend
from tr.envs.protected import CHECKRUN
from tr.envs.sandbox import SandboxConfig
from tr.envs.tasks import dockerfile as dfile
from tr.envs.tasks import testscript
from tr.envs.tasks.model import Task, script_interpreter, split_turns
from tr.envs.tasks.tb1 import solution_commands

ATTEMPTS = ("solution", "partial", "none")
RESULTS_DIR = "/logs/verifier"
TESTS_MOUNT = "/tests"
SOLUTION_DIR = "/tmp/.tr-solution"     # TB1: where solution.sh is copied to run
HARBOR_SOLUTION_DIR = "/solution"       # Harbor: solution/ lands here, as Harbor's harness does
SETUP_TIMEOUT_S = 300.0
RUN_STEP_TIMEOUT_S = 300.0
LOCAL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOCAL_ROOT_WORKDIR = "/app"    # local backend: stands for a Dockerfile that sets no WORKDIR (/)
PYTHON_SHIM_DIR = "/root/.local/bin"    # local backend: `python` -> python3 for python images


class TaskEnvironmentError(RuntimeError):
    """The task's environment could not be laid down (not the agent's fault)."""


class NeedsDocker(TaskEnvironmentError):
    """The task cannot run on the local backend; the message says why and what to use."""


# ---------------------------------------------------------------- sandbox set-up


def local_plan(task: Task) -> dfile.LocalPlan | None:
    """The Dockerfile's local plan (None when the task has no Dockerfile); NeedsDocker if it
    cannot be carried out locally."""
    env = task.environment
    if env.kind != "dockerfile":
        return None
    try:
        return dfile.plan(env.dockerfile, env.dockerfile.parent, default_workdir="/")
    except dfile.NeedsDocker as exc:
        raise NeedsDocker(str(exc)) from None
    except (dfile.DockerfileError, OSError, UnicodeDecodeError) as exc:
        raise TaskEnvironmentError(f"cannot read {env.dockerfile}: {exc}") from None


def sandbox_config(task: Task, backend="local", base=None):
    """The SandboxConfig a task runs under on ``backend`` (a name or a
    :class:`tr.envs.backends.Backend`): its workdir and ENV; on a backend that builds images,
    the image built from its Dockerfile (or the one it names)."""

    backend = get_backend(backend)
    config = _with_limits(task, base if base is not None else SandboxConfig(), backend)
    env = task.environment
    if backend.builds_images:
        return dataclasses.replace(config, workdir=_image_workdir(task),
                                   image=task_image(task, backend, config) or config.image)
    if env.kind == "image":
        raise NeedsDocker(f"{task.source_dir}: the task only names a prebuilt image "
                          f"({env.docker_image}); the {backend.name} backend builds no images: "
                          "this task needs the Docker backend (--backend docker)")
    plan = local_plan(task)
    if plan is not None:
        env = {**config.env, **plan.env}
        if dfile.PYTHON_IMAGES.match(plan.base_image) and "PATH" not in env:
            # a python image has `python`; the host's /usr may only have python3
            env["PATH"] = f"{LOCAL_PATH}:{PYTHON_SHIM_DIR}"
        # Docker's default WORKDIR is /, which a sandbox over the host cannot make writable
        workdir = plan.workdir if plan.workdir != "/" else LOCAL_ROOT_WORKDIR
        return dataclasses.replace(config, workdir=workdir, env=env)
    return dataclasses.replace(config, workdir=env.workdir)


def _with_limits(task: Task, config, backend):
    """The task's own resources (Harbor [environment]) over the caller's config; its runtime
    network only when the task asks for it (`allow_internet`), else the config's (off)."""

    backend = get_backend(backend)
    env = task.environment
    changes = {}
    if env.network is not None:
        changes["network"] = env.network
    if env.cpus is not None:
        changes["cpus"] = env.cpus
    if env.memory_mb is not None:
        changes["memory_mb"] = env.memory_mb
    if env.storage_mb is not None and not backend.disk_is_memory:   # a tmpfs disk is RAM
        changes["disk_mb"] = env.storage_mb
    return dataclasses.replace(config, **changes) if changes else config


def _image_workdir(task: Task) -> str:
    """The workdir a task's image ends with (its last WORKDIR), else the task's workdir."""
    if task.environment.kind == "dockerfile":
        try:
            return dfile.final_workdir(task.environment.dockerfile) or task.environment.workdir
        except (dfile.DockerfileError, OSError, UnicodeDecodeError) as exc:
            raise TaskEnvironmentError(f"cannot read {task.environment.dockerfile}: {exc}") from None
    return task.environment.workdir


def task_image(task: Task, backend="docker", config=None) -> str | None:
    """The image a task runs in on an image-building backend: built from its Dockerfile (how it
    was made kept in :data:`IMAGE_NOTES`), or the one it names; None for a setup-script task."""

    env = task.environment
    if env.kind == "dockerfile":
        import sys

        notes: list[str] = []
        tag = get_backend(backend).task_image(
            env.dockerfile, env.dockerfile.parent, notes=notes,
            log=lambda m: print(f"[image] {m}", file=sys.stderr),
            timeout_s=env.build_timeout_s, config=config or SandboxConfig())
        IMAGE_NOTES[tag] = tuple(notes)
        return tag
    return env.docker_image


def docker_image(task: Task) -> str | None:
    """The Docker image a task runs in (:func:`task_image` on the docker backend)."""
    return task_image(task, "docker")


def _copy_tree(sandbox, source: Path, dest: str, *, chmod: int | None = None) -> None:
    """Copy a host file or directory tree to `dest` in the sandbox (file modes kept)."""
    if source.is_file():
        mode = chmod if chmod is not None else source.stat().st_mode & 0o777
        sandbox.write_file(dest, source.read_bytes(), mode=mode)
        return
    files = sorted(p for p in source.rglob("*") if p.is_file())
    dirs = sorted({dest} | {str(Path(dest) / p.parent.relative_to(source)) for p in files})
    _must(sandbox.run_fresh("mkdir -p " + " ".join(shlex.quote(d) for d in dirs), timeout_s=60),
          f"mkdir for {source}")
    for path in files:
        mode = chmod if chmod is not None else path.stat().st_mode & 0o777
        sandbox.write_file(str(Path(dest) / path.relative_to(source)), path.read_bytes(), mode=mode)


def _must(result, what: str):
    if result.timed_out or result.exit_code != 0:
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        raise TaskEnvironmentError(f"{what} failed ({status}):\n{result.output[-2000:]}")
    return result


def prepare(task: Task, sandbox, backend=None) -> None:
    """Lay the task's initial state down in a started sandbox.

    setup layout: copy environment/files into the workdir, then run setup.sh there (fresh bash).
    dockerfile layout: a backend that builds images has them in the image; on another one the
    Dockerfile's steps are carried out in the sandbox.  ``backend``: default the sandbox's own.
    """

    backend = get_backend(backend if backend is not None else sandbox.backend)
    env = task.environment
    workdir = sandbox.config.workdir
    if env.kind == "setup":
        if env.files_dir is not None:
            _copy_tree(sandbox, env.files_dir, workdir)
        if env.setup_script is not None:
            script = env.setup_script.read_text(encoding="utf-8")
            command = (f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)} && "
                       f"bash -c {shlex.quote(script)} setup.sh")
            _must(sandbox.run_fresh(command, timeout_s=SETUP_TIMEOUT_S),
                  f"{env.setup_script.relative_to(task.source_dir)}")
    elif env.kind == "dockerfile" and not backend.builds_images:
        plan = local_plan(task)
        if dfile.PYTHON_IMAGES.match(plan.base_image):
            _must(sandbox.run_fresh(f"command -v python >/dev/null || {{ mkdir -p {PYTHON_SHIM_DIR} "
                                    f"&& ln -sf /usr/bin/python3 {PYTHON_SHIM_DIR}/python; }}",
                                    timeout_s=60), "providing `python` (a python base image)")
        for step in plan.steps:
            where = f"{env.dockerfile.relative_to(task.source_dir)}:{step.lineno}"
            if isinstance(step, dfile.CopyStep):
                for source in step.sources:
                    target = (str(Path(step.dest) / source.name)
                              if step.dest_is_dir and source.is_file() else step.dest)
                    _copy_tree(sandbox, source, target, chmod=step.chmod)
                for name, text in step.inline:         # COPY <<EOF here-documents
                    target = str(Path(step.dest) / name) if step.dest_is_dir else step.dest
                    _must(sandbox.run_fresh(f"mkdir -p {shlex.quote(str(Path(target).parent))}",
                                            timeout_s=60), f"COPY at {where}")
                    sandbox.write_file(target, text.encode(), mode=step.chmod or 0o644)
            else:
                exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in step.env.items())
                command = (f"{exports}mkdir -p {shlex.quote(step.workdir)} && "
                           f"cd {shlex.quote(step.workdir)} && /bin/sh -c {shlex.quote(step.command)}")
                result = sandbox.run_fresh(command, timeout_s=RUN_STEP_TIMEOUT_S)
                if result.exit_code != 0 and "Read-only file system" in result.output:
                    writable = ", ".join(sorted(getattr(sandbox, "areas", {}) or ()))
                    raise TaskEnvironmentError(
                        f"RUN at {where} writes outside the {backend.name} sandbox's writable folders "
                        f"({writable}); run this task with --backend docker:\n"
                        f"{result.output[-2000:]}")
                _must(result, f"RUN at {where}")


# ---------------------------------------------------------------- attempts


def attempt_script(task: Task, attempt: str) -> Path | None:
    if attempt not in ATTEMPTS:
        raise ValueError(f"unknown attempt {attempt!r}; expected one of {ATTEMPTS}")
    if attempt == "none":
        return None
    path = task.solution if attempt == "solution" else task.partial
    if path is None:
        what = "reference solution" if attempt == "solution" else "partial attempt (solution/partial.sh)"
        raise ValueError(f"task {task.id} has no {what}")
    return path


def attempt_turns(task: Task, attempt: str) -> list[str]:
    """The shell commands of an attempt, one per agent turn.

    tr layout: the script's blank-line-separated blocks. TB1 `solution.yaml`: one turn per
    command. Harbor / TB1 scripts: one turn that runs the whole script with its interpreter
    (copied by `run_attempt` to /solution (Harbor) or /tmp/.tr-solution (TB1)).
    """
    path = attempt_script(task, attempt)
    if path is None:
        return []
    text = path.read_text(encoding="utf-8")
    if task.layout == "tr":
        return split_turns(text)
    if path.suffix == ".yaml":

        return solution_commands(text)[0]
    interpreter = " ".join(shlex.quote(w) for w in script_interpreter(text))
    env = "".join(f"{k}={shlex.quote(v)} " for k, v in task.solution_env)
    return [f"{env}{interpreter} {_solution_dir(task)}/{path.name}"]


def _solution_dir(task: Task) -> str:
    return HARBOR_SOLUTION_DIR if task.layout == "harbor" else SOLUTION_DIR


def run_attempt(task: Task, sandbox, attempt: str) -> list:
    """Play an attempt's turns in the sandbox's persistent shell; returns their CommandResults."""
    path = attempt_script(task, attempt)
    if path is None:
        return []
    copied = task.layout != "tr" and path.suffix != ".yaml"
    if copied:
        if task.layout == "harbor":          # Harbor: the whole solution/ folder
            _copy_tree(sandbox, path.parent, HARBOR_SOLUTION_DIR)
        else:                                # TB1: solution.sh alone (its folder holds the tests)
            _copy_tree(sandbox, path, f"{SOLUTION_DIR}/{path.name}")
    results = []
    deadline = time.monotonic() + task.budgets.agent_timeout_s
    for turn in attempt_turns(task, attempt):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        results.append(sandbox.run(turn, timeout_s=left))
    if copied:       # removed from the host: no program of the sandbox runs
        if task.layout == "harbor":
            for entry in sorted(path.parent.iterdir()):
                sandbox.remove_path(f"{HARBOR_SOLUTION_DIR}/{entry.name}")
        else:
            sandbox.remove_path(SOLUTION_DIR)
    return results


# ---------------------------------------------------------------- verifier


def verifier_command(task: Task, workdir: str) -> str:
    """The shell command the protected runner executes (fresh shell, tests at /tests, the results
    folder made by the runner).  It calls no program of the sandbox before pytest: on Docker
    those are the agent's to replace."""
    spec = task.verifier
    cd = f"cd {shlex.quote(workdir)} && "
    if spec.env:      # Harbor [verifier].env (names checked by the loader)
        cd += "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env) + " && "
    if spec.script_text is not None:
        # the task's own script, as written but for the pytest lines (testscript.rewrite),
        # read by the verifier's own shell: no `bash` of the sandbox starts it
        head = (f"{cd}export TEST_DIR={TESTS_MOUNT} PYTHONDONTWRITEBYTECODE=1 "
                f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1\n{testscript.SERVED_FUNCTION}")
        if spec.kind == "output":     # its printed summary is the result: kept whole in a file
            return f"{head}( {spec.script_text}\n) > {RESULTS_DIR}/{vr.OUTPUT_FILENAME} 2>&1"
        return head + spec.script_text
    if spec.kind == "pytest" and spec.runner == "stdlib":
        files = " ".join(shlex.quote(f"{TESTS_MOUNT}/{rel}") for rel in spec.test_files)
        return (f"{cd}TEST_DIR={TESTS_MOUNT} \"$TR_PYTHON\" -I -S {CHECKRUN} "
                f"--junitxml={RESULTS_DIR}/{vr.JUNIT_FILENAME} {files}")
    if spec.kind == "pytest":
        files = " ".join(shlex.quote(f"{TESTS_MOUNT}/{rel}") for rel in spec.test_files)
        return (f"{cd}TEST_DIR={TESTS_MOUNT} PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
                f"\"$TR_PYTHON\" -P -m pytest "
                f"-q -rA -p no:cacheprovider --continue-on-collection-errors -o junit_family=xunit1 "
                f"--junitxml={RESULTS_DIR}/{vr.JUNIT_FILENAME} {files}")
    return f"{cd}TEST_DIR={TESTS_MOUNT} bash {TESTS_MOUNT}/{shlex.quote(spec.script)}"


def verify(task: Task, sandbox, workdir: str | None = None) -> vr.VerifierResult:
    """Run the task's verifier through the protected runner and score it (cwd: `workdir`,
    default the sandbox's workdir)."""

    workdir = workdir or sandbox.config.workdir
    command = verifier_command(task, workdir)
    beside = bool(task.verifier.servers) and get_backend(sandbox.backend).network_sibling
    with tempfile.TemporaryDirectory(prefix="tr-verifier-") as out:
        start = time.monotonic()
        run = protected.run_verifier(sandbox, task.tests_dir, command,
                                     timeout_s=task.budgets.verifier_timeout_s, output_dir=out,
                                     beside_agent=beside)
        duration = time.monotonic() - start
        files = _read_results(Path(out))
    if task.verifier.kind == "pytest":
        exit_code, collected = runner_word(task, run, files)
        result = vr.result_from_junit(
            files.get(vr.JUNIT_FILENAME), exit_code=exit_code, timed_out=run.timed_out,
            log=run.output, duration_s=duration, final_gate=task.verifier.final_gate,
            required=task.verifier.required, check_exit=True, collected=collected)
        result = _with_reward(result, files)
    elif task.verifier.kind == "output":
        result = vr.result_from_summary(files.get(vr.OUTPUT_FILENAME), exit_code=run.exit_code,
                                        timed_out=run.timed_out, duration_s=duration)
    else:
        result = vr.result_from_reward(files, exit_code=run.exit_code, timed_out=run.timed_out,
                                       log=run.output, duration_s=duration)
    result = result.with_task(task.id, task.family, task.tier)
    notes = environment_notes(task, sandbox) + server_notes(task, sandbox.backend)
    return dataclasses.replace(result, notes=tuple(notes)) if notes else result


def runner_word(task: Task, run, files: dict[str, str]) -> tuple[int | None, list[str] | str]:
    """(the harness's runner's exit status, the node ids it collected -- a str: why they are
    not known) of a pytest-kind verifier run.  A task's own script: the status is the last
    served pytest's record on the verifier's output (every record must be 0 or 1: a kill of
    any run is a crash); else the command's own status is the runner's."""
    exits, collections, overflow = vr.runner_records(run.marks)
    if overflow:
        return None, "the verifier's output held more harness records than any run writes"
    if task.verifier.script_text is not None:
        if not exits:
            return None, "no pytest run the harness served finished (no exit record)"
        crashed = [e for e in exits if e not in vr.RUNNER_EXITS]
        code = crashed[0] if crashed else exits[-1]
    else:
        code = run.exit_code
    return code, vr.collected_ids(files.get(vr.COLLECTED_FILENAME), collections)


def server_notes(task: Task, backend) -> list[str]:
    """For tests that talk to a local server: how they ran on ``backend`` (beside the agent's
    live processes, or after they were ended, and what to do then)."""

    if not task.verifier.servers:
        return []
    where = ", ".join(task.verifier.servers)
    backend = get_backend(backend)
    if backend.network_sibling:
        return [f"{where} talk to a local server: the tests ran beside the agent's processes, "
                "still running (a sibling of the sandbox sharing only its network, started from "
                "a snapshot of its files: servers the agent left answer on localhost; files they "
                "write while the tests run are not seen)"]
    return [f"{where} talk to a local server: the {backend.name} backend ends every agent "
            "process before the tests, so a server the agent left running is gone and those "
            "checks fail; run this task with --backend docker (the tests then run beside the "
            "agent's live processes)"]


IMAGE_NOTES: dict[str, tuple[str, ...]] = {}   # task image tag -> how it was made (this process)


def environment_notes(task: Task, sandbox=None, backend=None) -> list[str]:
    """How the environment differs from the task's own: installs skipped where the Dockerfile's
    steps run in the sandbox, a stand-in base image where it was built."""

    backend = get_backend(backend or getattr(sandbox, "backend", "local"))
    if not backend.builds_images:
        try:
            plan = local_plan(task)
        except TaskEnvironmentError:
            return []
        if plan is None:
            return []
        extra = ([f"the Dockerfile sets no WORKDIR (Docker's default is /): the {backend.name} "
                  f"backend works in {LOCAL_ROOT_WORKDIR}"] if plan.workdir == "/" else [])
        return list(plan.notes) + extra
    image = getattr(getattr(sandbox, "config", None), "image", None)
    return list(IMAGE_NOTES.get(image, ()))


def _with_reward(result: vr.VerifierResult, files: dict[str, str]) -> vr.VerifierResult:
    """A test script that runs pytest and also writes a reward file (Harbor's `test.sh`): the
    reward is recorded, and one below 1 is not a strict pass whatever the checks say (the
    script's own verdict, e.g. an extra condition after pytest)."""
    for name in vr.REWARD_FILENAMES:
        if name in files and result.error is None:
            try:
                reward = vr.parse_reward(name, files[name])
            except ValueError:
                return result
            return dataclasses.replace(result, reward=reward,
                                       strict_pass=result.strict_pass and reward >= 1.0)
    return result


def _read_results(out: Path) -> dict[str, str]:
    """The result files the verifier wrote: each read from exactly one path, the top of the
    copied-out results folder (a file of that name anywhere below it is not a result)."""
    found: dict[str, str] = {}
    for name in (vr.JUNIT_FILENAME, vr.OUTPUT_FILENAME, vr.COLLECTED_FILENAME,
                 *vr.REWARD_FILENAMES):
        path = out / name
        if path.is_file() and not path.is_symlink():
            found[name] = path.read_text(encoding="utf-8", errors="replace")
    return found


def run_task(task: Task, attempt: str = "solution", backend="local", *,
             base_config=None) -> tuple[vr.VerifierResult, list]:
    """Fresh sandbox -> prepare -> attempt -> verify. Environment failures become results with
    error='environment'; NeedsDocker propagates (the caller asked for the wrong backend)."""

    attempt_script(task, attempt)  # fail early on a missing script
    backend = get_backend(backend)
    config = sandbox_config(task, backend, base_config)
    with backend.make(config) as sandbox:
        try:
            prepare(task, sandbox, backend)
        except NeedsDocker:
            raise
        except TaskEnvironmentError as exc:
            return vr.failure(vr.ERROR_ENVIRONMENT, str(exc)).with_task(
                task.id, task.family, task.tier), []
        turns = run_attempt(task, sandbox, attempt)
        return verify(task, sandbox, config.workdir), turns
