"""Task model and loaders (tr / Harbor / TB1), the malformed corpus, the local Dockerfile
interpreter, and running fixture tasks end to end in real local sandboxes."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tr.envs.tasks import (
    TaskError, detect_layout, load_suite, load_task, split_turns, validate_task,
)
from tr.envs.tasks import dockerfile as dfile
from tr.envs.backends import get_backend
from tr.envs.tasks import runner
from tr.envs.tasks.model import test_functions as static_test_functions

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
MALFORMED = FIXTURES / "malformed"
MALFORMED_DIRS = sorted(p for p in MALFORMED.iterdir() if p.is_dir())


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize(
    "name, layout, family, tier, kind, budgets",
    [
        ("tb1-word-count", "tb1", "file-operations", "easy", "pytest", (120.0, 50, 30.0)),
        ("tb1-fix-config", "tb1", "system-administration", "medium", "pytest", (180.0, 50, 30.0)),
        ("harbor-csv-total", "harbor", "data-processing", "medium", "pytest", (300.0, 50, 60.0)),
        ("harbor-archive-logs", "harbor", "system-administration", "easy", "reward_file",
         (120.0, 50, 30.0)),
        ("tr-count-errors", "tr", "log-analysis", "easy", "pytest", (60.0, 10, 60.0)),
        ("tb1-py-inventory", "tb1", "software-engineering", "easy", "pytest", (90.0, 50, 45.0)),
        ("harbor-dedupe-lines", "harbor", "text-processing", "easy", "pytest", (100.0, 50, 40.0)),
        ("tb1-greet-summary", "tb1", "scripting", "easy", "output", (60.0, 50, 30.0)),
        ("tb1-compose-shelf", "tb1", "text-processing", "easy", "pytest", (100.0, 50, 30.0)),
        ("tb1-heredoc-rota", "tb1", "text-processing", "easy", "pytest", (100.0, 50, 30.0)),
    ],
)
def test_fixture_tasks_load_with_their_metadata(name, layout, family, tier, kind, budgets):
    task = load_task(TASKS / name)
    assert detect_layout(TASKS / name) == layout
    assert (task.id, task.layout, task.family, task.tier, task.verifier.kind) == (
        name, layout, family, tier, kind)
    assert (task.budgets.agent_timeout_s, task.budgets.max_turns,
            task.budgets.verifier_timeout_s) == budgets
    assert task.instruction.strip() and task.solution is not None and task.solution.is_file()
    assert validate_task(TASKS / name) == []


def test_external_pytest_runners_are_replaced_by_offline_pytest():
    word = load_task(TASKS / "tb1-word-count")
    assert word.verifier.test_files == ("test_outputs.py",)
    assert "installs pytest over the network" in word.verifier.note
    harbor = load_task(TASKS / "harbor-csv-total")
    assert harbor.verifier.kind == "pytest" and "tests/test.sh" in harbor.verifier.note
    assert load_task(TASKS / "harbor-archive-logs").verifier.script == "test.sh"


def test_tr_layout_fields():
    task = load_task(TASKS / "tr-count-errors")
    assert task.verifier.final_gate == "test_final_gate"
    assert task.partial == TASKS / "tr-count-errors" / "solution" / "partial.sh"
    assert task.environment.kind == "setup"
    assert task.environment.files_dir == TASKS / "tr-count-errors" / "environment" / "files"
    assert task.tags == ("grep",)


def test_load_suite_over_a_directory_sorts_by_id():
    ids = [t.id for t in load_suite(TASKS)]
    assert ids == sorted(p.name for p in TASKS.iterdir())


def test_malformed_corpus_is_large_enough():
    assert len(MALFORMED_DIRS) >= 20


@pytest.mark.parametrize("task_dir", MALFORMED_DIRS, ids=lambda p: p.name)
def test_malformed_task_gives_the_expected_clear_error(task_dir):
    expected = (task_dir / "EXPECTED").read_text().strip()
    problems = [str(p) for p in validate_task(task_dir)]
    assert any(expected in p for p in problems), problems
    if "shell syntax" not in expected and "here-document" not in expected:
        with pytest.raises(TaskError) as info:  # loading (cheap checks) refuses it too
            load_task(task_dir)
        assert expected in str(info.value)


def test_every_problem_is_reported_not_just_the_first(tmp_path):
    (tmp_path / "task.toml").write_text('[metadata]\ntier = "mythic"\n[agent]\nmax_turns = 0\n')
    problems = [str(p) for p in validate_task(tmp_path)]
    for needle in ("metadata.family: missing", "metadata.tier: unknown tier 'mythic'",
                   "agent.max_turns: must be a positive integer", "instruction.md: missing",
                   "tests/: missing"):
        assert any(needle in p for p in problems), (needle, problems)


def test_split_turns_blocks_and_comments():
    script = "#!/bin/bash\n# a comment block\n\ncd /app\necho a\n\n\n# note\nls -l\n\n   \necho 'x'\n"
    assert split_turns(script) == ["cd /app\necho a", "# note\nls -l", "echo 'x'"]
    assert split_turns("") == [] and split_turns("# only\n") == []


def test_static_test_discovery_matches_pytest_collection(tmp_path):
    (tmp_path / "test_a.py").write_text(textwrap.dedent("""
        import pytest
        def helper(): pass
        def test_one(): pass
        async def test_two(): pass
        class TestGroup:
            def test_three(self): pass
            def other(self): pass
        class Helper:
            def test_not_collected(self): pass
        class OutputChecks(unittest.TestCase):
            def test_four(self): pass
        class AsyncChecks(IsolatedAsyncioTestCase):
            async def test_five(self): pass
        def test_penalty_x(): pass
    """).replace("import pytest", "import pytest\nimport unittest\n"
                 "from unittest import IsolatedAsyncioTestCase"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", "test_a.py"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    collected = sorted(line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line)
    # pytest collects the async test too (and fails it at run time): both count as checks
    assert sorted(static_test_functions(tmp_path / "test_a.py")) == collected


# ---------------------------------------------------------------- Dockerfile interpretation


def test_dockerfile_plan_follows_env_arg_workdir_and_steps():
    task = load_task(TASKS / "tb1-fix-config")
    plan = runner.local_plan(task)
    assert plan.base_image == "python:3.13-slim-bookworm"
    assert plan.workdir == "/app"
    assert plan.env == {"LOG_DIR": "/app/logs", "SERVICE_NAME": "demo service"}
    runs = [s for s in plan.steps if isinstance(s, dfile.RunStep)]
    assert runs[1].command.startswith("mkdir -p ${CONF_DIR} &&")  # the shell expands it, as in
    assert runs[1].env["CONF_DIR"] == "/app/conf"                  # Docker: ARGs are in RUN's env
    assert runs[2].command == "sh -c 'echo \"$SERVICE_NAME\" > /app/NAME'"  # exec form


def test_dockerfile_parse_joins_continuations_and_drops_comments():
    text = "# syntax=docker/dockerfile:1\nFROM debian:12\nRUN a \\\n  # inner comment\n  b\n\nENV X=1\n"
    got = [(i.lineno, i.keyword, i.args) for i in dfile.parse(text)]
    assert got == [(2, "FROM", "debian:12"), (3, "RUN", "a b"), (7, "ENV", "X=1")]


def _plan(tmp_path, text, files=None):
    (tmp_path / "Dockerfile").write_text(text)
    for rel, data in (files or {}).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(data)
    return dfile.plan(tmp_path / "Dockerfile", tmp_path)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y tr-no-such-pkg bash\n",
         "not have (apt: tr-no-such-pkg); run it with --backend docker, or install them on the "
         "host (`apt-get install -y tr-no-such-pkg`)"),
        ("FROM ubuntu:24.04\nRUN pip install tr-no-such-dist==1.0\n", "(pip: tr-no-such-dist==1.0)"),
        ("FROM python:3.12\nRUN python -m pip install tr-no-such-dist\n",
         "`/usr/bin/python3 -m pip install tr-no-such-dist`"),
        ("FROM ubuntu:24.04\nRUN apt-get install -y bash && git clone https://x/y\n", "`git clone`"),
        ("FROM ubuntu:24.04\nRUN curl -sSL https://x.sh | sh\n", "`curl`"),
        ("FROM ghcr.io/someone/custom-image:1\n", "base image 'ghcr.io/someone/custom-image:1'"),
        ("FROM python:3.12-alpine\n", "base image 'python:3.12-alpine'"),
        ("FROM debian:12 AS build\nRUN true\nFROM debian:12\n", "multi-stage"),
        ("FROM debian:12\nUSER nobody\n", "non-root USER"),
        ("FROM debian:12\nADD https://example.com/x.tgz /app/\n", "from a URL"),
        ("FROM debian:12\nCOPY --from=build /x /y\n", "COPY --from"),
        ("FROM debian:12\nSHELL [\"/bin/zsh\", \"-c\"]\n", "SHELL is not supported"),
        ("FROM debian:12\nRUN --mount=type=cache,target=/x true\n", "BuildKit"),
    ],
)
def test_dockerfiles_needing_docker_say_so_with_the_line(tmp_path, text, needle):
    with pytest.raises(dfile.NeedsDocker) as info:
        _plan(tmp_path, text)
    message = str(info.value)
    assert needle in message and "--backend docker" in message
    assert f"Dockerfile:{info.value.lineno}:" in message


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "no instructions"),
        ("RUN true\n", "the first instruction must be FROM"),
        ("FROM debian:12\nCOPY missing.txt /app/\n", "source 'missing.txt' does not exist"),
        ("FROM debian:12\nCOPY ../../etc/passwd /app/\n", "outside the build context"),
        ("FROM debian:12\nRUN echo \\\n", "ends inside a line continuation"),
        ("FROM debian:12\nCOPY onlyone\n", "needs a source and a destination"),
        ("FROM debian:12\n!!! nonsense\n", "not an instruction"),
        ("FROM debian:12\nRUN <<EOF\necho never closed\n", "here-document <<EOF is not closed"),
        ("FROM debian:12\nCOPY <<EOT /app/x.txt\nhome is $HOME\nEOT\n",
         "variables in an unquoted here-document are not expanded by tr; quote the delimiter"),
        ("FROM debian:12\nCOPY <<EOT a.txt /app/\nx\nEOT\n", "here-documents takes them as its only sources"),
    ],
)
def test_malformed_dockerfiles_are_errors(tmp_path, text, needle):
    with pytest.raises(dfile.DockerfileError, match="Dockerfile:") as info:
        _plan(tmp_path, text)
    assert needle in str(info.value)


def _host_has_deb(name: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", name],
                          capture_output=True, text=True)
    return proc.stdout.startswith("ii")


def _host_has_dist(name: str) -> bool:
    return subprocess.run(["/usr/bin/python3", "-c", f"import importlib.metadata as m; "
                           f"m.distribution({name!r})"], capture_output=True).returncode == 0


def test_installs_the_host_already_has_are_skipped_with_a_note(tmp_path):
    assert _host_has_deb("bash") and _host_has_deb("coreutils") and _host_has_dist("pip")
    plan = _plan(tmp_path, "FROM ubuntu:24.04\nWORKDIR /app\n"
                 "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y bash "
                 "coreutils && rm -rf /var/lib/apt/lists/* && echo built > built.txt\n"
                 "RUN pip install --no-cache-dir pip\n")
    runs = [s.command for s in plan.steps if isinstance(s, dfile.RunStep)]
    assert runs == ["mkdir -p /app", "echo built > built.txt"]    # the rest kept, as written
    assert plan.notes == (
        "Dockerfile:3: skipped the install of bash, coreutils: the host has them",
        "Dockerfile:4: skipped the install of pip: the host has them")
    plan = _plan(tmp_path, "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y tmux "
                 "asciinema\n")
    assert plan.notes == ("Dockerfile:2: skipped tmux, asciinema: Terminal-Bench's own session "
                          "tools, which tr does not use",)


def test_ubuntu_package_names_map_to_debian():
    from tr.envs.tasks import packages

    assert [packages.debian_name(n) for n in ("libasound2t64", "python3.12-venv", "jq",
                                              "libgl1-mesa-glx")] == [
        "libasound2", "python3-venv", "jq", "libgl1"]
    assert packages.split_commands("a && b 'c && d'; e\nf || g") == [
        "a", "b 'c && d'", "e", "f || g"]


def test_copy_to_dot_or_the_workdir_copies_into_it(tmp_path):
    plan = _plan(tmp_path, "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\n"
                 "COPY a.sh .\nCOPY b.txt /app\nCOPY c.txt ./sub/.\n",
                 {"a.sh": "x", "b.txt": "y", "c.txt": "z"})
    copies = [(s.dest, s.dest_is_dir) for s in plan.steps if isinstance(s, dfile.CopyStep)]
    assert plan.workdir == "/app" and copies == [("/app", True), ("/app", True), ("/app/sub", True)]


def test_copy_destinations_resolve_against_workdir(tmp_path):
    plan = _plan(tmp_path, "FROM debian:12\nWORKDIR /srv\nWORKDIR web\nCOPY a.txt b.txt ./\n"
                 "COPY --chmod=755 run.sh bin/run\nCOPY conf conf\n",
                 {"a.txt": "a", "b.txt": "b", "run.sh": "x", "conf/x.ini": "y"})
    copies = [s for s in plan.steps if isinstance(s, dfile.CopyStep)]
    assert plan.workdir == "/srv/web"
    assert [(c.dest, c.dest_is_dir, c.chmod) for c in copies] == [
        ("/srv/web", True, None), ("/srv/web/bin/run", False, 0o755), ("/srv/web/conf", True, None)]


# ---------------------------------------------------------------- attempts and commands


def test_attempt_turns_per_layout(tmp_path):
    tr_task = load_task(TASKS / "tr-count-errors")
    assert len(runner.attempt_turns(tr_task, "solution")) == 3
    assert len(runner.attempt_turns(tr_task, "partial")) == 1
    assert runner.attempt_turns(tr_task, "none") == []
    harbor = load_task(TASKS / "harbor-csv-total")
    assert runner.attempt_turns(harbor, "solution") == ["/bin/bash /solution/solve.sh"]
    with pytest.raises(ValueError, match="no partial attempt"):
        runner.attempt_turns(harbor, "partial")
    with pytest.raises(ValueError, match="unknown attempt"):
        runner.attempt_turns(harbor, "best")


def test_tb1_semantics_solution_yaml_tbench_workdir_and_python_image():
    task = load_task(TASKS / "tb1-py-inventory")
    turns = runner.attempt_turns(task, "solution")
    assert len(turns) == 3 and turns[-1] == "python summarize.py"   # one turn per command
    assert turns[1].startswith("printf 'from inventory import total")
    # t-bench base images set WORKDIR /app; the Dockerfile sets none
    assert dfile.plan(task.environment.dockerfile, task.source_dir).workdir == "/app"
    assert dfile.final_workdir(task.environment.dockerfile) == "/app"
    config = runner.sandbox_config(task, "local")
    assert config.workdir == "/app" and config.env["PATH"].endswith(":/root/.local/bin")
    assert (task.budgets.agent_timeout_s, task.budgets.verifier_timeout_s) == (90.0, 45.0)
    assert "pyyaml==6.0.2: the project's interpreter has them" in task.verifier.note


def test_harbor_environment_limits_and_network_reach_the_sandbox_config():
    from tr.envs.sandbox import SandboxConfig

    task = load_task(TASKS / "harbor-dedupe-lines")
    env = task.environment
    assert (env.cpus, env.memory_mb, env.storage_mb, env.network, env.build_timeout_s) == (
        1.0, 1024, 2048, False, 300.0)
    assert task.verifier.env == (("EXPECTED_NAMES", "ada bob cy"),)
    assert task.solution_env == (("DEDUPE_INPUT", "/app/names.txt"),)
    assert runner.attempt_turns(task, "solution") == [
        "DEDUPE_INPUT=/app/names.txt /bin/bash /solution/solve.sh"]
    base = SandboxConfig(network=True, memory_mb=4096, disk_mb=512, cpus=2.0)
    docker = runner._with_limits(task, base, "docker")   # (sandbox_config would build the image)
    assert (docker.network, docker.memory_mb, docker.disk_mb, docker.cpus) == (
        False, 1024, 2048, 1.0)
    local = runner.sandbox_config(task, "local", base)
    assert (local.memory_mb, local.disk_mb) == (1024, 512)   # local disk is RAM: not raised
    default = load_task(TASKS / "harbor-csv-total")
    assert runner.sandbox_config(default, "local").network is False  # offline unless asked


def test_harbor_reward_below_one_is_not_strict_even_when_pytest_passes(tmp_path):
    task_dir = tmp_path / "reward-gate"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("x\n")
    (task_dir / "tests" / "test_outputs.py").write_text("def test_ok():\n    pass\n")
    (task_dir / "tests" / "test.sh").write_text(
        "pytest /tests/test_outputs.py -rA\n"
        "[ -f /app/extra ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
    result, _ = runner.run_task(load_task(task_dir), "none", "local")
    assert result.error is None and result.matched == result.executed == 1
    assert result.reward == 0.0 and not result.strict_pass


def test_verifier_command_is_offline_pytest_with_a_junit_report():
    task = load_task(TASKS / "tb1-word-count")
    command = runner.verifier_command(task, "/app")
    assert '"$TR_PYTHON" -P -m pytest' in command
    assert "--junitxml=/logs/verifier/junit.xml" in command
    assert command.rstrip().endswith("$TEST_DIR/test_outputs.py -rA")
    # the uv / curl / pip lines of run-tests.sh are no-ops; the rest runs as written
    live = [ln for ln in command.splitlines() if ln.strip() and not ln.lstrip().startswith((":", "#"))]
    assert not any(w in ln for ln in live for w in ("uv ", "pip", "curl", "apt-get")), live
    assert any(ln.lstrip().startswith('if [ "$PWD" = "/" ]') for ln in live)


# ---------------------------------------------------------------- end to end, local sandbox

EXTERNAL = ["tb1-word-count", "tb1-fix-config", "harbor-csv-total", "harbor-archive-logs",
            "tb1-py-inventory", "harbor-dedupe-lines", "tb1-greet-summary", "tb1-compose-shelf",
            "tb1-heredoc-rota"]


@pytest.mark.parametrize("name", EXTERNAL + ["tr-count-errors"])
def test_fixture_reference_solution_passes_and_nothing_fails(name):
    task = load_task(TASKS / name)
    solved, turns = runner.run_task(task, "solution", "local")
    assert solved.error is None, (solved.error_detail, solved.log[-2000:])
    assert solved.strict_pass and solved.matched == solved.executed, solved.to_json(indent=1)
    assert all(t.exit_code == 0 for t in turns), [t.output for t in turns]
    nothing, _ = runner.run_task(task, "none", "local")
    assert nothing.error is None and not nothing.strict_pass
    assert nothing.matched < nothing.executed
    assert (solved.task_id, solved.family, solved.tier) == (task.id, task.family, task.tier)


def test_tr_partial_attempt_lands_in_between_and_penalties_bite():
    task = load_task(TASKS / "tr-count-errors")
    partial, _ = runner.run_task(task, "partial", "local")
    assert (partial.matched, partial.executed, partial.strict_pass) == (1, 3, False)
    from tr.envs.backends import make_sandbox

    config = runner.sandbox_config(task)
    with make_sandbox("local", config) as box:
        runner.prepare(task, box)
        assert box.read_file("/app/data/README") == b"placeholder kept by setup\n"
        box.run("cd /app && grep -c ' ERROR ' data/app.log > errors.txt && echo x >> data/app.log")
        damaged = runner.verify(task, box, config.workdir)
    checks = {c.name: c.passed for c in damaged.checks}
    assert checks == {"test_error_count": False, "test_levels": False,
                      "test_penalty_log_untouched": False, "test_final_gate": False}
    assert (damaged.matched, damaged.executed) == (-1, 3)


def _run_custom(task, commands):
    from tr.envs.backends import make_sandbox

    config = runner.sandbox_config(task)
    with make_sandbox("local", config) as box:
        runner.prepare(task, box)
        for command in commands:
            box.run(command)
        return runner.verify(task, box, config.workdir)


def test_agent_cannot_shadow_pytest_or_plant_conftest():
    task = load_task(TASKS / "tb1-word-count")
    fake = ("import sys\nsys.exit(0)\n")
    result = _run_custom(task, [
        f"printf '{fake}' > /app/pytest.py",
        "printf 'def pytest_collection_modifyitems(items):\\n    items.clear()\\n' > /app/conftest.py",
    ])
    assert result.error is None and result.executed == 3 and result.matched == 0


def _tr_task(tmp_path, tests: str, *, setup: str | None = None, timeout: int = 60) -> Path:
    task_dir = tmp_path / "t-task"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "task.toml").write_text(
        f'[metadata]\nfamily = "x"\ntier = "easy"\n[verifier]\ntimeout_sec = {timeout}\n'
        + ('[environment]\nsetup = "environment/setup.sh"\n' if setup else ""))
    (task_dir / "instruction.md").write_text("Do the thing.\n")
    (task_dir / "tests" / "test_x.py").write_text(tests)
    if setup:
        (task_dir / "environment").mkdir()
        (task_dir / "environment" / "setup.sh").write_text(setup)
    return task_dir


def test_verifier_timeout_is_reported_as_a_verifier_error(tmp_path):
    task = load_task(_tr_task(tmp_path, "import time\n\ndef test_slow():\n    time.sleep(60)\n",
                              timeout=3))
    result, _ = runner.run_task(task, "none", "local")
    assert result.error == "timeout" and not result.strict_pass and result.executed == 0


def test_pytest_crash_is_reported_as_a_verifier_error(tmp_path):
    task_dir = _tr_task(tmp_path, "def test_x():\n    pass\n")
    (task_dir / "tests" / "conftest.py").write_text("def pytest_configure(config):\n"
                                                    "    raise RuntimeError('broken harness')\n")
    result, _ = runner.run_task(load_task(task_dir), "none", "local")
    assert result.error in ("crash", "parse_error") and "broken harness" in result.log


def test_failing_setup_is_an_environment_error_not_an_agent_failure(tmp_path):
    task = load_task(_tr_task(tmp_path, "def test_x():\n    pass\n",
                              setup="echo preparing\nexit 3\n"))
    result, turns = runner.run_task(task, "none", "local")
    assert result.error == "environment" and "exit code 3" in result.error_detail
    assert "preparing" in result.error_detail and turns == []


def test_docker_only_task_refuses_the_local_backend_clearly(tmp_path):
    task_dir = tmp_path / "needs-apt"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("Use jq.\n")
    (task_dir / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get update && apt-get install -y tr-no-such-pkg\n")
    task = load_task(task_dir)
    with pytest.raises(runner.NeedsDocker, match=r"Dockerfile:3: .*needs the Docker backend"):
        runner.run_task(task, "none", "local")


def test_failing_dockerfile_run_step_names_the_line(tmp_path):
    task_dir = tmp_path / "bad-run"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("x\n")
    (task_dir / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM debian:12\nWORKDIR /app\nRUN echo step-output && false\n")
    result, _ = runner.run_task(load_task(task_dir), "none", "local")
    assert result.error == "environment"
    assert "RUN at environment/Dockerfile:3" in result.error_detail
    assert "step-output" in result.error_detail
    (task_dir / "environment" / "Dockerfile").write_text("FROM debian:12\nRUN mkdir /protected\n")
    result, _ = runner.run_task(load_task(task_dir), "none", "local")
    assert "RUN at environment/Dockerfile:2 writes outside the local sandbox's writable folders (" \
        in result.error_detail and "run this task with --backend docker" in result.error_detail


def _docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


def test_tb1_compose_service_built_from_a_sub_folder_is_the_task_environment():
    """TB1's harness builds the one service of docker-compose.yaml (`build: {context: client}`):
    that Dockerfile, with its own folder as the build context, is the task's environment."""
    task = load_task(TASKS / "tb1-compose-shelf")
    assert task.environment.kind == "dockerfile"
    assert task.environment.dockerfile == TASKS / "tb1-compose-shelf" / "client" / "Dockerfile"


@pytest.mark.skipif(not _docker_available(), reason="no Docker daemon on this machine")
@pytest.mark.parametrize("name", ["tb1-compose-shelf", "tb1-heredoc-rota"])
def test_docker_backend_builds_compose_sub_folders_and_here_documents(name):
    """A compose service's sub-folder context, and COPY/RUN here-documents (BuildKit syntax)
    through the engine's classic builder: the reference passes, the empty attempt passes only
    the check of the built environment."""
    task = load_task(TASKS / name)
    solved, turns = runner.run_task(task, "solution", "docker")
    assert solved.error is None and solved.strict_pass, (solved.error_detail, solved.log[-2000:])
    nothing, _ = runner.run_task(task, "none", "docker")
    assert nothing.error is None and (nothing.matched, nothing.executed) == (1, 2), nothing.log


def test_here_documents_are_parsed_and_inlined_for_a_classic_builder():
    """`COPY <<"X" dest`, `COPY <<A <<B dir/` and `RUN <<EOF`: the parser keeps the documents
    (a `#` line inside one is text, not a comment); inline_heredocs makes them context files and
    a plain RUN whose script is the document."""
    import base64
    import re
    path = TASKS / "tb1-heredoc-rota" / "Dockerfile"
    text = path.read_text()
    copies = [i for i in dfile.parse(text, path) if i.heredocs]
    assert [(i.keyword, [d for d, _ in i.heredocs]) for i in copies] == [
        ("COPY", ["ROTA"]), ("RUN", ["EOF"]), ("COPY", ["ONE", "TWO"])]
    assert "# a line that starts" in copies[0].heredocs[0][1]
    plain, files = dfile.inline_heredocs(text, path)
    assert files == {".tr-heredocs/0/ROTA": copies[0].heredocs[0][1],
                     ".tr-heredocs/1/ONE": "first\n", ".tr-heredocs/1/TWO": "second\n"}
    assert "COPY .tr-heredocs/1/ONE .tr-heredocs/1/TWO /app/extra/" in plain
    script = re.search(r'RUN /bin/sh -c "\$\(echo (\S+) \| base64 -d\)"', plain).group(1)
    assert base64.b64decode(script).decode().startswith("mkdir -p /app/notes\n")
    assert "<<" not in plain and "thu cy" not in plain
    step = dfile.plan(path, path.parent).steps[1]
    assert step.inline == (("ROTA", copies[0].heredocs[0][1]),) and step.dest == "/app/rota.txt"


@pytest.mark.skipif(not _docker_available(), reason="no Docker daemon on this machine")
def test_docker_backend_builds_the_dockerfile_and_agrees_with_local():
    """The same TB1 task (ARG/ENV/RUN steps) built by Docker and carried out locally."""
    task = load_task(TASKS / "tb1-fix-config")
    on_docker, turns = runner.run_task(task, "solution", "docker")
    assert on_docker.error is None, (on_docker.error_detail, on_docker.log[-2000:])
    assert on_docker.strict_pass and [t.exit_code for t in turns] == [0]
    on_local, _ = runner.run_task(task, "solution", "local")
    assert [(c.name, c.passed) for c in on_docker.checks] == [
        (c.name, c.passed) for c in on_local.checks]


def test_final_workdir_even_for_docker_only_dockerfiles(tmp_path):
    (tmp_path / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nARG BASE=/srv\nWORKDIR $BASE\nRUN apt-get install -y jq\nWORKDIR app\n")
    assert dfile.final_workdir(tmp_path / "Dockerfile") == "/srv/app"
    (tmp_path / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN true\n")
    assert dfile.final_workdir(tmp_path / "Dockerfile") is None


def test_local_run_skips_installs_the_host_has_and_records_it(tmp_path):
    task_dir = tmp_path / "has-bash"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("x\n")
    (task_dir / "tests" / "test_x.py").write_text(
        "from pathlib import Path\n\ndef test_rest_of_run_ran():\n"
        "    assert Path('/app/made.txt').read_text() == 'made\\n'\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM debian:12\nWORKDIR /app\nRUN apt-get update && apt-get install -y bash && "
        "echo made > made.txt\n")
    result, _ = runner.run_task(load_task(task_dir), "none", "local")
    assert result.error is None and result.strict_pass, result.log
    assert result.notes == ("Dockerfile:3: skipped the install of bash: the host has them",)
    assert type(result).from_json(result.to_json()) == result


def test_a_printed_short_test_summary_is_read_like_terminal_bench_does():
    from tr.envs import verifier as vr

    out = ("noise\nPASSED fake_before_summary\n"
           "==================== short test summary info ====================\n"
           "PASSED tests/test_a.py::test_one\nFAILED tests/test_a.py::test_two - boom\n"
           "SKIPPED tests/test_a.py::test_three\n=== 1 failed, 1 passed ===\n")
    result = vr.result_from_summary(out, exit_code=1, timed_out=False)
    assert [(c.name, c.outcome) for c in result.checks] == [
        ("test_one", "passed"), ("test_three", "skipped"), ("test_two", "failed")]
    assert (result.matched, result.executed, result.strict_pass) == (1, 2, False)
    assert vr.result_from_summary("PASSED x\n", exit_code=0, timed_out=False).error == "parse_error"


PLAIN_TB1_TEST = "def test_file():\n    assert open('/app/x').read()\n"


def _write_tb1(d, instruction: str, run_tests: str, tests: str) -> None:
    """A minimal TB1 task folder: task.yaml, run-tests.sh and tests/test_outputs.py."""
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text(f"instruction: {instruction}\n")
    (d / "run-tests.sh").write_text(run_tests)
    (d / "tests" / "test_outputs.py").write_text(tests)


def test_tests_that_examine_their_own_interpreter_are_noted(tmp_path):
    """Under the protected verifier `sys.executable` / `import pip` see the project's Python:
    such a task says so (its empty attempt could pass), a plain one does not."""
    for name, body in (("tb1-own-python", "import sys\n\ndef test_pip():\n"
                                          "    assert sys.executable\n"),
                       ("tb1-plain", PLAIN_TB1_TEST)):
        _write_tb1(tmp_path / name, "fix pip",
                   "pip install pytest\npytest $TEST_DIR/test_outputs.py\n", body)
    own = load_task(tmp_path / "tb1-own-python").verifier.note
    assert "test_outputs.py examine the Python that runs the tests" in own, own
    assert "examine the Python" not in load_task(tmp_path / "tb1-plain").verifier.note


SERVER_TB1_TEST = ("import urllib.request\n\ndef test_page():\n    body = urllib.request.urlopen("
                   "'http://localhost:8080/index.html', timeout=20).read()\n"
                   "    assert body.strip() == b'served by the agent'\n")


def test_tests_that_talk_to_a_local_server_are_named(tmp_path):
    """TB1/Harbor tests that query localhost are found (file and port): where the backend can,
    they run beside the agent's live processes; the local backend's note says what to do."""
    for name, body in (("tb1-web", SERVER_TB1_TEST), ("tb1-plain", PLAIN_TB1_TEST)):
        _write_tb1(tmp_path / name, "serve /app on port 8080",
                   "pytest $TEST_DIR/test_outputs.py -rA\n", body)
    web = load_task(tmp_path / "tb1-web")
    assert web.verifier.servers == ("test_outputs.py (localhost:8080)",)
    assert load_task(tmp_path / "tb1-plain").verifier.servers == ()
    note, = runner.server_notes(web, "local")
    assert note.startswith("test_outputs.py (localhost:8080) talk to a local server: the local "
                           "backend ends every agent process"), note
    assert "run this task with --backend docker" in note
    assert "ran beside the agent's processes" in runner.server_notes(web, "docker")[0]
    assert runner.server_notes(load_task(tmp_path / "tb1-plain"), "local") == []


@pytest.mark.skipif(not _docker_available(), reason="no Docker daemon on this machine")
def test_a_server_the_agent_left_answers_the_tests_on_docker(tmp_path):
    """TB1 semantics on Docker: the reference starts a web server and leaves it running; the
    tests reach it (they run in a sibling sharing only the agent's network), the empty attempt
    fails.  On the local backend the server is ended first, and the result says what to do."""
    task_dir = tmp_path / "tb1-serve"
    _write_tb1(task_dir, "serve /app/site on port 8080", "pytest $TEST_DIR/test_outputs.py -rA\n",
               SERVER_TB1_TEST)
    (task_dir / "solution.sh").write_text(
        "#!/bin/bash\nmkdir -p /app/site && echo 'served by the agent' > /app/site/index.html\n"
        "cd /app/site && (setsid python3 -m http.server 8080 >/dev/null 2>&1 &)\n"
        "for i in $(seq 50); do python3 -c 'import urllib.request as u; "
        "u.urlopen(\"http://localhost:8080/\")' 2>/dev/null && break; sleep 0.2; done\n")
    task = load_task(task_dir)
    result, _ = runner.run_task(task, "solution", "docker")
    assert result.error is None and result.strict_pass, result.log
    assert any("ran beside the agent's processes" in n for n in result.notes), result.notes
    result, _ = runner.run_task(task, "none", "docker")
    assert not result.strict_pass and "Connection refused" in result.log, result.log
    result, _ = runner.run_task(task, "solution", "local")
    assert not result.strict_pass, result.log
    assert any("--backend docker" in n for n in result.notes), result.notes


def test_test_time_installs_use_the_harness_pip_without_the_cwd():
    """A test-time `pip install` of what the project lacks runs the harness's pip from its own
    mount (the verifier's Python cannot import pip) and with -P, so a `pip` package the agent
    left in the working directory is not what runs."""
    from tr.envs.tasks import testscript

    text = testscript.rewrite("pip install pytest tr-no-such-dist==1.0\npytest $TEST_DIR/t.py\n",
                              junit="/logs/verifier/junit.xml").text
    line = next(ln for ln in text.splitlines() if "tr-no-such-dist" in ln)
    assert line.startswith('PIP_CONFIG_FILE=/dev/null PYTHONPATH="/opt/tr/pip:$PYTHONPATH" '
                           '"$TR_PYTHON" -P -m pip install --isolated'), line
    assert '--cert /opt/tr/verifier/ca-certificates.crt' in line
    assert '--target "$HOME/site" tr-no-such-dist==1.0' in line


def _probe_wheel(path: Path) -> None:
    """A wheel of `tr-probe-pkg` 1.0 whose import registers an exit hook that rewrites the
    verifier's junit report as a pass (an agent's stand-in for a package the tests install)."""
    import zipfile

    init = ("import atexit\n\ndef _fake():\n    import glob\n    for p in glob.glob("
            "'/logs/verifier/*.xml'):\n        open(p, 'w').write('<testsuites><testsuite "
            "name=\"pytest\" errors=\"0\" failures=\"0\" skipped=\"0\" tests=\"1\"><testcase "
            "classname=\"fake\" name=\"test_answer\"/></testsuite></testsuites>')\n\n"
            "atexit.register(_fake)\nVALUE = 'from the agent'\n")
    info = "tr_probe_pkg-1.0.dist-info"
    files = {"tr_probe_pkg/__init__.py": init,
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: tr-probe-pkg\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_pip_config_of_the_agent_does_not_choose_what_the_tests_install(tmp_path, backend):
    """A test-time `pip install` (the task's run-tests.sh) is the harness's: pip reads no
    configuration file of the sandbox, so an agent's /etc/pip.conf pointing it at its own
    package (here one that rewrites the results at exit) installs nothing of the agent's."""
    if backend == "docker" and not _docker_available():
        pytest.skip("no Docker daemon on this machine")
    task_dir = tmp_path / "tb1-installs"
    _write_tb1(task_dir, "write 42 to /app/answer.txt",
               "pip install pytest tr-probe-pkg==1.0\npytest $TEST_DIR/test_outputs.py -rA\n",
               "def test_answer():\n    try:\n        import tr_probe_pkg  # noqa: F401\n"
               "    except ImportError:\n        pass\n"
               "    assert open('/app/answer.txt').read().strip() == '42'\n")
    wheel = tmp_path / "tr_probe_pkg-1.0-py3-none-any.whl"
    _probe_wheel(wheel)
    task = load_task(task_dir)
    with get_backend(backend).make(runner.sandbox_config(task, backend)) as box:
        runner.prepare(task, box)
        box.write_file(f"/app/dist/{wheel.name}", wheel.read_bytes())
        for conf in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "/root/.config/pip/pip.conf",
                     "/root/.pip/pip.conf"):
            box.write_file(conf, "[global]\nno-index = true\nfind-links = /app/dist\n")
        box.run("echo 41 > /app/answer.txt")
        result = runner.verify(task, box)
    assert not result.strict_pass, result.log
    assert "fake" not in repr(result.checks), result.checks


def test_tests_importing_what_the_image_pip_installs_get_it_installed_for_the_verifier(tmp_path):
    """TB1 runs its tests with the sandbox's Python, which has what the Dockerfile pip-installed;
    the protected verifier (the project's Python) installs those same requirements for itself at
    test time -- only the ones the test files import and the project lacks (aliases such as
    sklearn -> scikit-learn), never the sandbox's copies."""
    task_dir = tmp_path / "tb1-image-deps"
    _write_tb1(task_dir, "cluster", "pip install pytest\npytest $TEST_DIR/test_outputs.py -rA\n",
               "import json\nimport pytest\nimport helper\nfrom tr_probe_dist.sub import x\n\n"
               "def test_fit():\n    from sklearn.datasets import make_blobs\n"
               "    import numpy\n")
    (task_dir / "tests" / "helper.py").write_text("X = 1\n")
    (task_dir / "Dockerfile").write_text(
        "FROM python:3.13\nWORKDIR /app\n"
        "RUN pip install --no-cache-dir numpy==2.3.1 \\\n    scikit-learn==1.7.0 six "
        "-r requirements.txt && pip3 install 'tr-probe-dist>=1.0' --index-url http://x.invalid\n"
        "RUN apt-get update && apt-get install -y jq\n")
    spec = load_task(task_dir).verifier
    first = spec.script_text.splitlines()[0]
    assert first.startswith('PIP_CONFIG_FILE=/dev/null PYTHONPATH="/opt/tr/pip:$PYTHONPATH"'), first
    assert first.split("  # tr:")[0].endswith(
        '--target "$HOME/site" \'tr-probe-dist>=1.0\' scikit-learn==1.7.0'), first
    assert "the tests import tr-probe-dist>=1.0, scikit-learn==1.7.0, which the Dockerfile" \
        in spec.note, spec.note
    (task_dir / "Dockerfile").write_text("FROM python:3.13\nRUN pip install six\n")
    assert "Dockerfile installs" not in load_task(task_dir).verifier.note
