"""The protected verifier: the agent's planted tampering never changes the verdict.

A tiny real pytest verifier (tests/test_answer.py: /app/answer.txt must hold 42) runs through
``run_verifier`` on both backends; each test plants one attack while the answer is wrong (41) and
checks the verdict is still "fail" -- and the honest runs show the verifier can pass and fail.
"""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tr.envs import protected
from tr.envs.backends import make_sandbox
from tr.envs.sandbox import SandboxConfig

from test_sandbox import backend, docker_problem  # noqa: F401 - shared fixtures

COMMAND = ('mkdir -p /logs/verifier && cd /app && "$TR_PYTHON" -P -m pytest -q -rA '
           '-p no:cacheprovider --junitxml=/logs/verifier/junit.xml /tests/test_answer.py')
PASSING_JUNIT = ('<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="0" '
                 'tests="1"><testcase classname="fake" name="test_answer"/></testsuite>'
                 '</testsuites>')


@pytest.fixture
def tests_dir(tmp_path):
    d = tmp_path / "tests"
    d.mkdir()
    (d / "test_answer.py").write_text(textwrap.dedent("""\
        import time
        def test_answer():
            time.sleep(0.5)
            assert open("/app/answer.txt").read().strip() == "42"
        """))
    return d


@pytest.fixture
def box(backend):
    with make_sandbox(backend, SandboxConfig(memory_mb=1024, disk_mb=64)) as sb:
        yield sb


def verdict(box, tests_dir, out: Path, command: str = COMMAND, timeout_s: float = 60):
    """(passed?, result) from the junit file the verifier wrote -- the real one, copied out."""
    result = protected.run_verifier(box, tests_dir, command, timeout_s=timeout_s,
                                    output_dir=out)
    junit = out / "junit.xml"
    if not junit.is_file() or junit.is_symlink():
        return False, result
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return (failed == 0 and int(suite.get("tests", 0)) > 0 and result.exit_code == 0), result


def test_honest_answers_pass_and_fail(box, tests_dir, tmp_path):
    box.run("echo 41 > /app/answer.txt")
    ok, r = verdict(box, tests_dir, tmp_path / "a")
    assert not ok and r.exit_code == 1, r.output
    box.run("echo 42 > /app/answer.txt")
    ok, r = verdict(box, tests_dir, tmp_path / "b")
    assert ok, r.output


def test_tests_are_nowhere_during_the_episode(box, tests_dir, tmp_path):
    r = box.run("ls /tests 2>&1; find / -name 'test_answer.py' -not -path '/proc/*' 2>/dev/null",
                timeout_s=60)
    assert "test_answer.py" not in r.output
    box.run("echo 42 > /app/answer.txt")
    assert verdict(box, tests_dir, tmp_path / "o")[0]


TAMPERS = {
    "conftest_in_workspace": textwrap.dedent("""\
        cat > /app/conftest.py <<'EOF'
        import pytest
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            rep = outcome.get_result()
            rep.outcome = "passed"
        EOF
        cp /app/conftest.py /root/conftest.py; cp /app/conftest.py /tmp/conftest.py
        cp /app/conftest.py /conftest.py 2>/dev/null; true"""),
    "sitecustomize_and_user_site": textwrap.dedent("""\
        echo 'import os; os._exit(0)' > /app/sitecustomize.py
        mkdir -p /root/.local/lib/python3.11/site-packages
        echo 'import os; os._exit(0)' > /root/.local/lib/python3.11/site-packages/usercustomize.py
        echo 'import os; os._exit(0)' > /root/.local/lib/python3.11/site-packages/evil.pth
        export PYTHONPATH=/app PYTHONSTARTUP=/app/sitecustomize.py"""),
    "symlinked_results": textwrap.dedent(f"""\
        mkdir -p /app/fake && echo '{PASSING_JUNIT}' > /app/fake/junit.xml
        rm -rf /logs/verifier && ln -s /app/fake /logs/verifier"""),
    "prewritten_results": textwrap.dedent(f"""\
        mkdir -p /logs/verifier && echo '{PASSING_JUNIT}' > /logs/verifier/junit.xml
        chmod 444 /logs/verifier/junit.xml"""),
    "fake_pytest_on_path": textwrap.dedent("""\
        mkdir -p /app/bin && printf '#!/bin/sh\\nexit 0\\n' > /app/bin/pytest
        chmod +x /app/bin/pytest && cp /app/bin/pytest /app/bin/python3
        export PATH=/app/bin:$PATH
        cp /app/bin/pytest /usr/local/bin/pytest 2>/dev/null
        mkdir -p /app/pytest && echo 'raise SystemExit(0)' > /app/pytest/__init__.py
        echo 'raise SystemExit(0)' > /app/pytest/__main__.py; true"""),
    "modified_test_runner": textwrap.dedent("""\
        mkdir -p /tests 2>/dev/null && printf 'def test_answer():\\n    pass\\n' \\
            > /tests/test_answer.py 2>/dev/null
        printf '[pytest]\\naddopts = -p no:python\\n' > /pytest.ini 2>/dev/null
        printf '[pytest]\\naddopts = --co\\n' > /app/pytest.ini; true"""),
    "lingering_process_fixes_answer_later": "(sleep 0.3; echo 42 > /app/answer.txt) &",
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_tampering_does_not_change_the_verdict(box, tests_dir, tmp_path, tamper):
    box.run("echo 41 > /app/answer.txt")
    box.run(TAMPERS[tamper], timeout_s=30)
    ok, r = verdict(box, tests_dir, tmp_path / "out")
    assert not ok, f"tamper {tamper!r} turned a failing answer into a pass:\n{r.output}"
    assert "1 failed" in r.output, r.output
    junit = tmp_path / "out" / "junit.xml"
    assert junit.is_file() and not junit.is_symlink() and "fake" not in junit.read_text()


def test_verifier_timeout_is_its_own(box, tests_dir, tmp_path):
    r = protected.run_verifier(box, tests_dir, "sleep 100", timeout_s=1, output_dir=tmp_path)
    assert r.timed_out and r.exit_code is None


def test_links_written_by_the_verifier_are_not_followed_out(box, tests_dir, tmp_path):
    r = protected.run_verifier(box, tests_dir,
                               "mkdir -p /logs/verifier && echo ok > /logs/verifier/r.txt && "
                               "ln -s /etc/passwd /logs/verifier/leak && "
                               "ln -s /root /logs/verifier/home", timeout_s=30,
                               output_dir=tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.txt"]


def test_bad_arguments_are_named(box, tmp_path):
    with pytest.raises(Exception, match="tests_dir"):
        protected.run_verifier(box, tmp_path / "missing", "true", timeout_s=5,
                               output_dir=tmp_path)
    with pytest.raises(ValueError, match="timeout_s"):
        protected.run_verifier(box, tmp_path, "true", timeout_s=0, output_dir=tmp_path)


def test_agent_scripts_run_by_the_tests_keep_their_own_folder_on_sys_path(box, tmp_path):
    """The verifier's pytest runs with ``-P`` (cwd not on sys.path), but processes the tests
    start see a normal Python: ``python3 script.py`` imports modules beside the script and
    ``python3 -c`` imports from its cwd -- as when the agent ran them."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_scripts.py").write_text(textwrap.dedent("""\
        import subprocess
        def test_script_imports_its_neighbour():
            r = subprocess.run(["python3", "/app/main.py"], capture_output=True, text=True)
            assert r.stdout == "helper says hi\\n", r.stderr
        def test_dash_c_imports_from_cwd():
            r = subprocess.run(["python3", "-c", "import helper; print(helper.NAME)"],
                               cwd="/app", capture_output=True, text=True)
            assert r.stdout == "helper\\n", r.stderr
        """))
    box.run("printf 'NAME = \"helper\"\\n' > /app/helper.py && "
            "printf 'import helper\\nprint(helper.NAME, \"says hi\")\\n' > /app/main.py && "
            "mkdir -p /app/pytest && echo 'raise SystemExit(0)' > /app/pytest/__init__.py")
    command = COMMAND.replace("/tests/test_answer.py", "/tests/test_scripts.py")
    result = protected.run_verifier(box, tests, command, timeout_s=60, output_dir=tmp_path / "o")
    assert result.exit_code == 0 and "2 passed" in result.output, result.output
