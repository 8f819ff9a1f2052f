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
    return verdict_of(out, result)


def verdict_of(out: Path, result):
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
    "lingering_process_fixes_answer_later": "(sleep 3; echo 42 > /app/answer.txt) &",
    # Docker's PID 1 starts `sleep` again once end_session killed its child: were that the
    # container's, the agent's would run beside the verifier and rewrite the results
    "replaced_sleep_respawned_by_pid1": textwrap.dedent(f"""\
        cat > /tmp/evil-sleep <<'EOF'
        #!/bin/sh
        while :; do echo '{PASSING_JUNIT}' > /logs/verifier/junit.xml; done 2>/dev/null
        EOF
        chmod 755 /tmp/evil-sleep
        for s in /usr/bin/sleep /bin/sleep; do rm -f $s 2>/dev/null && cp /tmp/evil-sleep $s; done
        true"""),
}


@pytest.mark.parametrize("backend, beside", [("local", False), ("docker", False), ("docker", True)],
                         ids=["local-after-agent", "docker-after-agent", "docker-beside-agent"],
                         indirect=["backend"])
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_tampering_does_not_change_the_verdict(box, tests_dir, tmp_path, tamper, beside):
    """Also beside the agent's live processes (Docker's network sibling; the local backend has
    none and refuses `beside_agent`): the same attacks, and the agent's processes alive meanwhile."""
    box.run("echo 41 > /app/answer.txt")
    box.run(TAMPERS[tamper], timeout_s=30)
    result = protected.run_verifier(box, tests_dir, COMMAND, timeout_s=60,
                                    output_dir=tmp_path / "out", beside_agent=beside)
    ok, r = verdict_of(tmp_path / "out", result)
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


# ------------------------------------------------------------------ beside the agent (servers)
# Tests that talk to a server the agent left running run in a sibling of the sandbox sharing only
# its network (run_verifier(beside_agent=True); Docker).  The agent's server here is also an
# attacker: on the tests' first request -- so while the verifier runs, after the snapshot -- it
# fixes the answer file, rewrites the tests, the results, /etc/hosts (Docker shares that file
# between containers of one network namespace) and the verifier's interpreter where it can
# reach them, and records which processes it can see.  Only the server's honest reply may count.

AGENT_SERVER = textwrap.dedent(f"""\
    import http.server, os, subprocess

    def attack():
        tried = []
        for path, text in (("/app/answer.txt", "42\\n"),
                           ("/etc/hosts", "127.0.0.1 localhost tampered-by-agent\\n"),
                           ("/tests/test_live.py", "def test_answer():\\n    pass\\n"),
                           ("/logs/verifier/junit.xml", {PASSING_JUNIT!r}),
                           ("/opt/tr/verifier/site/sitecustomize.py", "import os; os._exit(0)\\n"),
                           ("/opt/tr/python/lib/evil.txt", "x")):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
                tried.append("wrote " + path)
            except OSError as e:
                tried.append(f"refused {{path}}: {{e.strerror}}")
        seen = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    seen.append(open(f"/proc/{{pid}}/cmdline", "rb").read().replace(b"\\0", b" ")
                                .decode(errors="replace"))
                except OSError:
                    pass
        with open("/root/attack.log", "w") as f:
            f.write("\\n".join(tried) + "\\n--- processes\\n" + "\\n".join(seen) + "\\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            attack()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"served by the agent")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", 8765), Handler).serve_forever()
    """)

LIVE_TESTS = textwrap.dedent("""\
    import urllib.request

    def test_server_answers():
        body = urllib.request.urlopen("http://localhost:8765/", timeout=20).read()
        assert body == b"served by the agent"

    def test_answer():
        assert open("/app/answer.txt").read().strip() == "42"

    def test_hosts_are_the_snapshot():
        assert "tampered-by-agent" not in open("/etc/hosts").read()
    """)
LIVE_COMMAND = COMMAND.replace("/tests/test_answer.py", "/tests/test_live.py")


def _outcomes(junit: Path) -> dict:
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    return {case.get("name"): ("failed" if case.find("failure") is not None
                               or case.find("error") is not None else "passed")
            for case in suite.iter("testcase")}


def _start_agent_server(box) -> None:
    box.write_file("/app/server.py", AGENT_SERVER)
    r = box.run("echo 41 > /app/answer.txt; (setsid python3 /app/server.py >/tmp/server.log 2>&1 &);"
                " for i in $(seq 100); do python3 -c 'import socket; socket.create_connection("
                "(\"127.0.0.1\", 8765), 1)' 2>/dev/null && break; sleep 0.1; done; echo up",
                timeout_s=60)
    assert r.output.strip().endswith("up"), r.output


def test_tests_beside_the_agent_reach_its_server_and_nothing_else(backend, tmp_path):
    """Docker: the verifier's sibling reaches the agent's live server, while what that server
    does during the tests -- fix the answer, rewrite the tests, results, /etc/hosts, the
    verifier's interpreter -- changes nothing the tests read, and the agent sees none of the
    verifier's processes.  Local: refused, naming the backend that can."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_live.py").write_text(LIVE_TESTS)
    with make_sandbox(backend, SandboxConfig(memory_mb=1024, disk_mb=64)) as box:
        _start_agent_server(box)
        if backend == "local":
            with pytest.raises(Exception, match="--backend docker"):
                protected.run_verifier(box, tests, LIVE_COMMAND, timeout_s=60,
                                       output_dir=tmp_path / "out", beside_agent=True)
            return
        result = protected.run_verifier(box, tests, LIVE_COMMAND, timeout_s=120,
                                        output_dir=tmp_path / "out", beside_agent=True)
        junit = tmp_path / "out" / "junit.xml"
        assert junit.is_file() and "fake" not in junit.read_text(), result.output
        assert _outcomes(junit) == {"test_server_answers": "passed", "test_answer": "failed",
                                    "test_hosts_are_the_snapshot": "passed"}, result.output
        # the attack did run, in the agent's container, while the tests ran
        assert box.alive()
        log = box.read_file("/root/attack.log").decode()
        assert "wrote /app/answer.txt" in log and "wrote /tests/test_live.py" in log, log
        assert "refused /opt/tr/python/lib/evil.txt: Read-only file system" in log, log
        assert "refused /opt/tr/verifier/site/sitecustomize.py" in log, log
        processes = log.split("--- processes", 1)[1]
        assert "server.py" in processes and "pytest" not in processes, processes
        assert box.read_file("/app/answer.txt").decode().strip() == "42"   # its own copy only
        # the same sandbox, verified the usual way, ends the server: its test fails
        result = protected.run_verifier(box, tests, LIVE_COMMAND, timeout_s=120,
                                        output_dir=tmp_path / "again")
        assert _outcomes(tmp_path / "again" / "junit.xml")["test_server_answers"] == "failed"


@pytest.mark.parametrize("backend", ["docker"], indirect=True)   # local refuses beside_agent
def test_beside_the_agent_a_process_that_answers_later_does_not_count(backend, tmp_path):
    """A process the agent leaves to write the answer once the verifier has started (it polls for
    the sibling's connection) writes into the agent's files, not the snapshot the tests read;
    an answer already there at the snapshot does count (the agent's files as its turn ended)."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_answer.py").write_text(textwrap.dedent("""\
        import socket, time
        def test_answer():
            socket.create_connection(("127.0.0.1", 8766), 5).close()   # "the tests have begun"
            time.sleep(1.0)
            assert open("/app/answer.txt").read().strip() == "42"
        """))
    with make_sandbox(backend, SandboxConfig(memory_mb=1024, disk_mb=64)) as box:
        box.run("echo 41 > /app/answer.txt; (setsid python3 -c 'import socket; s = socket."
                "create_server((\"127.0.0.1\", 8766)); s.accept(); open(\"/app/answer.txt\", "
                "\"w\").write(\"42\\n\")' >/dev/null 2>&1 &); sleep 1", timeout_s=30)
        result = protected.run_verifier(box, tests, COMMAND, timeout_s=120,
                                        output_dir=tmp_path / "late", beside_agent=True)
        assert _outcomes(tmp_path / "late" / "junit.xml") == {"test_answer": "failed"}, \
            result.output
        assert box.read_file("/app/answer.txt").decode().strip() == "42"   # it did write
        # written before the next snapshot, the answer is the agent's files as its turn ended
        (tests / "test_answer.py").write_text(
            "def test_answer():\n    assert open('/app/answer.txt').read().strip() == '42'\n")
        result = protected.run_verifier(box, tests, COMMAND, timeout_s=120,
                                        output_dir=tmp_path / "now", beside_agent=True)
        assert _outcomes(tmp_path / "now" / "junit.xml") == {"test_answer": "passed"}, \
            result.output
