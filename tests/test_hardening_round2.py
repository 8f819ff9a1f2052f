"""Adversarial tests of the protected verifier, round two (issue 45's red-team classes).

Every attack task here has no honest answer: its test holds only the SHA-256 of a secret that
exists nowhere in the sandbox, so a pass can only be forged.  Each test plays the agent through
the sandbox's persistent shell, then runs the real protected verifier of the real task
(``tr.envs.tasks.runner.verify``) on both backends where the backend has the class.  Payloads
leave a marker file in ``/app`` when they run inside the verifier, so a test can tell "closed"
(the hook never ran) from "caught" (it ran and the verdict still refused it).

Classes: NSS modules named by ``/etc/nsswitch.conf``; pytest's prepend import mode putting ``/``
on ``sys.path``; TB1 ``run-tests.sh`` lines that run the sandbox's pytest; a verdict that ignores
how the runner ended and which tests it ran (an agent program, ``/etc/alternatives``, a git
``core.fsmonitor`` hook); Docker snapshots (sparse files, setuid bits); and all of them riding
the pre-verifier snapshot into an idle recovery child.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import textwrap
from pathlib import Path

import pytest

from tr.envs import verifier as vr
from tr.envs.backends import make_sandbox
from tr.envs.sandbox import CappedOutput, SandboxConfig, SandboxError
from tr.envs.tasks import load_task
from tr.envs.tasks import testscript
from tr.envs.tasks.runner import prepare, sandbox_config, verify

from test_hardening import Says
from test_sandbox import backend, docker_problem  # noqa: F401

SMALL = dict(memory_mb=768, pids=256, disk_mb=64, file_size_mb=256, cpu_time_s=120)
# the secret itself is dropped at once: only its hash reaches the task
SECRET_HASH = hashlib.sha256(secrets.token_hex(16).encode()).hexdigest()
PASS_XML = ('<testsuites><testsuite name="pytest" tests="1" errors="0" failures="0" skipped="0">'
            '<testcase classname="test_outputs" name="test_answer" file="/tests/test_outputs.py"/>'
            '</testsuite></testsuites>')


def secret_test(body: str = "") -> str:
    return textwrap.dedent("""\
        import hashlib
        import subprocess
        from pathlib import Path


        def test_answer():
        {body}
            data = open("/app/answer.txt", "rb").read().strip()
            assert hashlib.sha256(data).hexdigest() == "{hash}"
        """).format(body=textwrap.indent(textwrap.dedent(body), "    ") or "    pass",
                    hash=SECRET_HASH)


def make_task(root: Path, name: str, body: str = "", *, package: bool = False,
              runner: str | None = None):
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "environment").mkdir()
    (d / "solution").mkdir()
    runner_line = f'runner = "{runner}"\n' if runner else ""
    (d / "task.toml").write_text(
        '[metadata]\nfamily = "hardening"\ntier = "easy"\n[agent]\ntimeout_sec = 300\n'
        f"max_turns = 10\n[verifier]\ntimeout_sec = 60\n{runner_line}")
    (d / "instruction.md").write_text("Put the secret in /app/answer.txt.\n")
    (d / "solution" / "solve.sh").write_text("echo unknowable > /app/answer.txt\n")
    (d / "environment" / "setup.sh").write_text(
        "echo nothing > /app/answer.txt && git init -q /app/repo\n")
    (d / "tests" / "test_outputs.py").write_text(secret_test(body))
    if package:
        (d / "tests" / "__init__.py").write_text("")
    return load_task(d)


def agent(box, command: str, timeout_s: float = 120):
    return box.run(textwrap.dedent(command), timeout_s=timeout_s)


def attack(backend, task, script: str, markers=()):
    """Run the agent's ``script`` in a fresh sandbox of ``task``, then the verifier; returns the
    result and which payload markers (files in /app) exist afterwards."""
    config = sandbox_config(task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as box:
        prepare(task, box, backend)
        r = agent(box, script)
        result = verify(task, box)
        return result, present(box, markers), r.output


def present(box, markers) -> list[str]:
    """The payload markers (files in /app) that exist in `box`: which hooks ran."""
    found = []
    for m in markers:
        try:
            box.read_file(f"/app/{m}")
            found.append(m)
        except (SandboxError, OSError):
            pass
    return found


def c_payload(marker: str) -> str:
    """A shared library whose constructor, inside the verifier only (TR_PYTHON is set there),
    leaves ``marker`` and arranges that its process writes a passing report and exits 0."""
    return textwrap.dedent(r"""
        #include <stdio.h>
        #include <stdlib.h>
        #include <unistd.h>
        static void forge(void) {
            FILE *f = fopen("/logs/verifier/junit.xml", "w");
            if (f) { fputs("%s", f); fclose(f); }
            _exit(0);
        }
        __attribute__((constructor)) static void init(void) {
            if (!getenv("TR_PYTHON")) return;
            FILE *m = fopen("/app/%s", "w");
            if (m) fclose(m);
            atexit(forge);
        }
        """) % (PASS_XML.replace('"', '\\"'), marker)


# ----------------------------------------------------------------------------- NSS modules

NSS_ATTACK = """\
cat > /tmp/nss.c <<'EOF'
{payload}
EOF
gcc -shared -fPIC -o /tmp/.nss.so.2 /tmp/nss.c && echo built
mkdir -p /app/libnss_x
cp /etc/nsswitch.conf /tmp/nsswitch.orig 2>/dev/null
printf 'passwd: x/../../tmp/.nss files\\ngroup: x/../../tmp/.nss files\\nhosts: x/../../tmp/.nss files dns\\n' > /etc/nsswitch.conf
"""
NSS_LOOKUPS = """\
import pwd, socket
pwd.getpwuid(0)
Path("/app").owner()
socket.getaddrinfo("localhost", 80)
"""


@pytest.mark.parametrize("runner", ["pytest", "stdlib"])
def test_nss_modules_of_the_agent_never_load_in_the_verifier(tmp_path, backend, runner):
    task = make_task(tmp_path, f"nss-{runner}", NSS_LOOKUPS, runner=runner)
    script = NSS_ATTACK.format(payload=c_payload("nss-ran"))
    result, ran, out = attack(backend, task, script, ["nss-ran"])
    assert "built" in out, out
    assert not result.strict_pass, f"an NSS module forged a pass on {backend}:\n{result.log}"
    assert ran == [], f"the agent's NSS module ran inside the verifier on {backend}"


def test_the_verifiers_nsswitch_is_files_only_and_passwd_stays_data(tmp_path, backend):
    """Honest side: a user the agent added is found (``/etc/passwd`` is data), through the
    harness's ``nsswitch.conf``."""
    body = """\
    import pwd
    assert pwd.getpwnam("alice").pw_uid == 1234
    assert open("/etc/nsswitch.conf").read().startswith("# The protected verifier")
    """
    task = make_task(tmp_path, "nss-honest", body)
    config = sandbox_config(task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as box:
        prepare(task, box, backend)
        agent(box, "echo 'alice:x:1234:1234::/home/alice:/bin/sh' >> /etc/passwd")
        result = verify(task, box)
    checks = {c.name: c for c in result.checks}
    assert result.error is None, result.log
    assert "assert b'nothing'" in checks["test_answer"].message or \
        "AssertionError" in checks["test_answer"].message, checks["test_answer"].message
    assert "alice" not in checks["test_answer"].message and "nsswitch" not in \
        checks["test_answer"].message, checks["test_answer"].message


# ----------------------------------------------------------------------------- import mode

PY_FORGE = f"""\
import atexit, os
open("/app/py-ran", "w").close()
def _forge():
    open("/logs/verifier/junit.xml", "w").write({PASS_XML!r})
    os._exit(0)
atexit.register(_forge)
def mean(xs):
    return 0
"""


def test_no_agent_folder_is_on_the_tests_sys_path(tmp_path, backend):
    """A package of tests (``tests/__init__.py``): in prepend mode pytest put ``/`` first on
    ``sys.path`` and the agent's ``/statistics.py`` shadowed the standard library's."""
    task = make_task(tmp_path, "prepend", "import statistics\nstatistics.mean([1.0])\n",
                     package=True)
    script = "cat > /tmp/forge.py <<'EOF'\n" + PY_FORGE + "EOF\n" + \
        "for d in / /app /tmp /logs /root; do cp /tmp/forge.py $d/statistics.py; done 2>/dev/null; true"
    result, ran, _ = attack(backend, task, script, ["py-ran"])
    assert not result.strict_pass, f"a module at / forged a pass on {backend}:\n{result.log}"
    assert ran == [], f"the agent's module was imported by the verifier on {backend}"


def test_a_package_of_tests_still_imports_its_helpers(tmp_path, backend):
    """Honest side of importlib mode: sibling, absolute-package and relative imports work."""
    task = make_task(tmp_path, "helpers", "from . import helpers\nimport helpers as h2\n"
                     "from tests import helpers as h3\nassert helpers.X == h2.X == h3.X == 7\n",
                     package=True)
    (task.tests_dir / "helpers.py").write_text("X = 7\n")
    config = sandbox_config(task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as box:
        prepare(task, box, backend)
        result = verify(task, box)
    (check,) = result.checks
    assert result.error is None and check.outcome == "failed", result.log
    assert "hexdigest" in check.message or "assert" in check.message, check.message


# ----------------------------------------------------------------------------- TB1 scripts

WRAPPED = ["timeout 120 pytest $TEST_DIR/test_outputs.py -rA",
           "timeout -s KILL 60 pytest $TEST_DIR/test_outputs.py",
           "env PYTHONHASHSEED=0 pytest $TEST_DIR/test_outputs.py -rA",
           "xvfb-run -a pytest $TEST_DIR/test_outputs.py",
           "/usr/local/bin/pytest $TEST_DIR/test_outputs.py",
           "python3.11 -m pytest $TEST_DIR/test_outputs.py",
           "if timeout 60 /usr/bin/python3 -m pytest $TEST_DIR; then echo ok; fi",
           "X=1 pytest $TEST_DIR/test_outputs.py"]


@pytest.mark.parametrize("line", WRAPPED)
def test_the_tb1_rewrite_serves_pytest_behind_wrappers(line):
    done = testscript.rewrite(line + "\n", junit="/logs/verifier/junit.xml")
    assert testscript.SERVED in done.text, done.text
    assert testscript.unserved_pytest(done.text) is None, done.text
    assert "$TEST_DIR" in done.text and "--junitxml=/logs/verifier/junit.xml" in done.text


def write_tb1(root: Path, name: str, run_line: str) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text("instruction: Put the secret in /app/answer.txt.\n"
                                 "difficulty: easy\nmax_agent_timeout_sec: 300\n"
                                 "max_test_timeout_sec: 60\n")
    (d / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n"
                                  "RUN echo nothing > /app/answer.txt\n")
    (d / "solution.sh").write_text("echo unknowable > /app/answer.txt\n")
    (d / "run-tests.sh").write_text(f"#!/bin/bash\ncd /app\n{run_line}\n")
    (d / "tests" / "test_outputs.py").write_text(secret_test())
    return d


def test_a_tb1_script_running_an_unserved_pytest_is_refused_at_load(tmp_path):
    from tr.envs.tasks import TaskError
    d = write_tb1(tmp_path, "unserved", "bash -c 'pytest $TEST_DIR/test_outputs.py -rA'")
    with pytest.raises(TaskError, match=r"run-tests.sh.*pytest \$TEST_DIR/test_outputs.py"):
        load_task(d)


FAKE_PYTEST = f"""\
cat > /tmp/fake-pytest <<'EOF'
#!/bin/sh
mkdir -p /logs/verifier
echo '{PASS_XML}' > /logs/verifier/junit.xml
echo '=== short test summary info ==='; echo 'PASSED test_outputs.py::test_answer'
touch /app/fake-ran
EOF
chmod 755 /tmp/fake-pytest
for d in /usr/local/bin /usr/bin /bin; do cp /tmp/fake-pytest $d/pytest 2>/dev/null; done
for p in /usr/local/bin/python3.11 /usr/bin/python3.11; do
  [ -e $p ] && {{ mv $p $p.real; printf '#!/bin/sh\\ncase "$*" in *pytest*) exec /tmp/fake-pytest;; esac\\nexec %s.real "$@"\\n' $p > $p; chmod 755 $p; }}
done 2>/dev/null; true
"""


@pytest.mark.parametrize("line", [WRAPPED[0], WRAPPED[2], WRAPPED[4], WRAPPED[5]])
def test_tb1_wrapped_pytest_lines_run_the_harness_pytest(tmp_path, backend, line):
    d = write_tb1(tmp_path, "wrapped", line)
    task = load_task(d)
    result, ran, _ = attack(backend, task, FAKE_PYTEST, ["fake-ran"])
    assert not result.strict_pass, f"{line!r} ran the sandbox's pytest on {backend}:\n{result.log}"
    assert ran == [], f"{line!r}: the sandbox's pytest ran on {backend}"
    assert result.error is None and result.executed == 1, result.log


# ----------------------------------------------------------------------------- the verdict

KILLER = f"""\
cat > /app/check.sh <<'EOF'
#!/bin/sh
touch /app/{{marker}}
echo '{PASS_XML}' > /logs/verifier/junit.xml
# the test's python (pytest) is an ancestor: kill every python ancestor with -9
p=$PPID
while [ "$p" -gt 1 ]; do
  case "$(tr '\\0' ' ' < /proc/$p/cmdline)" in *pytest*|*checkrun*) kill -9 $p;; esac
  p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status)
done
EOF
chmod 755 /app/check.sh
"""


@pytest.mark.parametrize("runner", ["pytest", "stdlib"])
def test_a_report_written_before_the_runner_is_killed_is_no_pass(tmp_path, backend, runner):
    """The tests run the agent's program (by design); it writes a passing report and kills the
    runner with -9.  The report is not the runner's word."""
    task = make_task(tmp_path, f"killer-{runner}", 'subprocess.run(["/app/check.sh"])\n',
                     runner=runner)
    result, ran, _ = attack(backend, task, KILLER.format(marker="killer-ran"), ["killer-ran"])
    assert ran == ["killer-ran"], "the agent's program should have run (by design)"
    assert not result.strict_pass, f"a killed runner's forged report passed on {backend}"
    assert result.error == vr.ERROR_CRASH, (result.error, result.error_detail)


def test_alternatives_links_of_the_agent_are_not_followed_by_the_verifier(tmp_path):
    """``awk`` is ``/usr/bin/awk -> /etc/alternatives/awk``; the agent's ``/etc`` (local) may
    point it anywhere."""
    task = make_task(tmp_path, "alternatives", 'subprocess.run(["awk", "BEGIN{}"])\n')
    script = KILLER.format(marker="awk-ran").replace("/app/check.sh", "/tmp/awk") + \
        "ln -sfn /tmp/awk /etc/alternatives/awk && echo linked\n"
    result, ran, out = attack("local", task, script, ["awk-ran"])
    assert "linked" in out, out
    assert not result.strict_pass, result.log
    assert ran == [], "the verifier's awk followed the agent's /etc/alternatives"


def test_the_verifiers_git_runs_no_fsmonitor_nor_hooks(tmp_path, backend):
    task = make_task(tmp_path, "fsmonitor",
                     'subprocess.run(["git", "-c", "safe.directory=*", "-C", "/app/repo", '
                     '"status"], capture_output=True)\n'
                     'subprocess.run(["git", "-c", "safe.directory=*", "-C", "/app/repo", '
                     '"commit", "-q", "--allow-empty", "-m", "x"], capture_output=True)\n')
    script = KILLER.format(marker="git-ran").replace("/app/check.sh", "/tmp/hook") + """\
        cd /app/repo && git config core.fsmonitor /tmp/hook && mkdir -p .git/hooks \\
          && cp /tmp/hook .git/hooks/pre-commit && cp /tmp/hook .git/hooks/post-commit \\
          && git config user.email a@b && git config user.name a && echo planted
        """
    result, ran, out = attack(backend, task, textwrap.dedent(script), ["git-ran"])
    assert "planted" in out, out
    assert not result.strict_pass, result.log
    assert ran == [], f"a git hook of the agent ran in the verifier on {backend}"


def cases(*specs):
    return [vr.JUnitCase(m, k, n, o) for m, k, n, o in specs]


def test_the_verdict_needs_the_runners_own_word():
    one = cases(("test_a", "", "test_x", "passed"))
    two = cases(("test_a", "", "test_x", "passed"), ("test_a", "TestK", "test_y[1]", "failed"))
    ids = ["test_a.py::test_x", "test_a.py::TestK::test_y[1]"]
    assert vr.runner_word_problem(two, exit_code=1, collected=ids) is None
    assert vr.runner_word_problem(one, exit_code=0, collected=ids[:1]) is None
    for code in (-9, 2, 3, 4, 5, 137, 139):
        assert "not 0 or 1" in vr.runner_word_problem(one, exit_code=code, collected=None)
    broken = two + [vr.JUnitCase("test_b", "", "collection", "error", "collection failure",
                                 collection_error=True)]
    assert vr.runner_word_problem(broken, exit_code=2, collected=ids) is None
    assert "not 0 or 1" in vr.runner_word_problem(two, exit_code=2, collected=ids)
    assert "exited 0" in vr.runner_word_problem(two, exit_code=0, collected=None)
    assert "exited 1" in vr.runner_word_problem(one, exit_code=1, collected=None)
    assert "missing" in vr.runner_word_problem(one, exit_code=0, collected=ids)
    assert "never collected" in vr.runner_word_problem(two, exit_code=1, collected=ids[:1])
    assert "outside" in vr.runner_word_problem(one, exit_code=0,
                                               collected=["../app/test_a.py::test_x"])
    # through result_from_junit: a passing report with a killed runner is a crash
    result = vr.result_from_junit(PASS_XML, exit_code=137, timed_out=False, check_exit=True,
                                  collected=["test_outputs.py::test_answer"])
    assert not result.strict_pass and result.error == vr.ERROR_CRASH
    ok = vr.result_from_junit(PASS_XML, exit_code=0, timed_out=False, check_exit=True,
                              collected=["test_outputs.py::test_answer"])
    assert ok.strict_pass and ok.error is None


def test_collected_ids_must_match_the_printed_digest():
    text = json.dumps(["test_outputs.py::test_answer"])
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert vr.collected_ids(text, [(1, digest)]) == ["test_outputs.py::test_answer"]
    forged = json.dumps([])
    assert "not what" in vr.collected_ids(forged, [(1, digest)])
    assert "no record" in vr.collected_ids(text, [])
    assert "wrote no" in vr.collected_ids(None, [(1, digest)])
    exits, coll, over = vr.runner_records(["[tr-pytest-exit] 1", "[tr-pytest-exit] x",
                                           f"[tr-collected] 1 {digest}", "[tr-marks-overflow]"])
    assert exits == [1, -1] and coll == [(1, digest)] and over


def test_records_survive_output_cut_and_spam():
    out = CappedOutput(1000)
    out.add(b"x" * 5000 + b"\n[tr-pytest-exit] 137\n" + b"y" * 5000)
    out.add(b"\n[tr-pytest-exit] 0\n")
    assert "[tr-pytest-exit] 137" not in out.text()
    assert out.marks == ["[tr-pytest-exit] 137", "[tr-pytest-exit] 0"]
    spam = CappedOutput(1000)
    spam.add(b"[tr-pytest-exit] 0\n" * 5000)
    assert len(spam.marks) == 1001 and spam.marks[-1] == "[tr-marks-overflow]"


def test_marks_match_a_plain_line_split_however_the_stream_is_chunked():
    import random
    from tr.envs.sandbox import MARK_PREFIX, MAX_MARK_BYTES

    def reference(text: bytes) -> list[str]:
        return [ln.decode("utf-8", "replace").rstrip("\r") for ln in text.split(b"\n")[:-1]
                if ln.startswith(MARK_PREFIX) and len(ln) <= MAX_MARK_BYTES]

    rng = random.Random(45)
    words = [b"[tr-x] 1", b"[tr-", b"-x", b"\n", b"ab", b"[t", b"r-y 2", b"[tr-" + b"z" * 600,
             b"\n[tr-q]\n", b"x[tr-no]", b"\r\n"]
    for _ in range(2000):
        text = b"".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        out = CappedOutput(64)
        for a, b in zip([0] + cuts, cuts + [len(text)]):
            out.add(text[a:b])
        assert out.marks == reference(text), text


# ----------------------------------------------------------------------------- Docker snapshots

def test_docker_snapshots_refuse_sparse_files_beyond_the_disk_budget(docker_problem):
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    with make_sandbox("docker", SandboxConfig(**SMALL)) as box:
        r = agent(box, "mkdir -p /opt/sparse && for i in 1 2 3; do "
                       "truncate -s 40M /opt/sparse/f$i; done; du -s /opt/sparse | cut -f1")
        assert int(r.output.split()[0]) < 1024, r.output     # nothing allocated
        with pytest.raises(SandboxError, match="apparent size"):
            box.snapshot()


def test_a_refused_pre_verifier_snapshot_is_the_agents_failure_not_infra(tmp_path, docker_problem):
    """An agent that makes its state too big to snapshot must not get its episode dropped as an
    infrastructure fault (dropping removes a failure from the batch): the episode counts, fails,
    and says why."""
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    from tr.agent.harness import EpisodeSpec, run_episode
    from tr.agent.rollout import TaskEnv, discard_snapshot_ref
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer
    task = make_task(tmp_path, "oversized")
    env = TaskEnv("docker", SandboxConfig(**SMALL))
    rec = run_episode(EpisodeSpec(task=task, episode_id="actor"),
                      Says(["mkdir -p /opt/sparse && for i in 1 2 3; do "
                            "truncate -s 40M /opt/sparse/f$i; done"]),
                      env, ChatLayout(ByteTokenizer()), snapshot_before_verify=True,
                      policy_name="says")
    discard_snapshot_ref(rec.snapshot_ref)
    assert rec.status.counts and rec.passed is False, (rec.status, rec.error)
    assert rec.snapshot_ref is None and "snapshot refused" in (rec.error or ""), rec.error


def test_docker_snapshots_strip_setuid_bits_of_the_writable_layer(docker_problem):
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    with make_sandbox("docker", SandboxConfig(**SMALL)) as box:
        agent(box, "mkdir -p /opt/s && cp /bin/true /opt/s/su && chmod 6755 /opt/s/su "
                   "&& cp /bin/true /opt/s/sg && chmod 2755 /opt/s/sg")
        snap = box.snapshot()
        box.restore(snap)
        r = agent(box, "stat -c %a /opt/s/su /opt/s/sg")
        assert r.output.split() == ["755", "755"], r.output


# ----------------------------------------------------------------------------- recovery children

HOOKS = {
    "nss": NSS_ATTACK.format(payload=c_payload("hook-nss")),
    "prepend": "cat > /tmp/forge.py <<'EOF'\n" + PY_FORGE.replace("py-ran", "hook-prepend")
               + "EOF\ncp /tmp/forge.py /statistics.py 2>/dev/null; true",
    "git": KILLER.format(marker="hook-git").replace("/app/check.sh", "/tmp/hook")
           + "cd /app/repo && git config core.fsmonitor /tmp/hook\n",
    "alternatives": KILLER.format(marker="hook-alternatives").replace("/app/check.sh", "/tmp/awk")
                    + "ln -sfn /tmp/awk /etc/alternatives/awk 2>/dev/null; true\n",
}
# On Docker a test's programs are the container's, the agent's to replace (`awk` through
# /etc/alternatives as well as /usr/bin/awk itself): that hook may run -- it cannot pass.
MAY_RUN = {"local": set(), "docker": {"alternatives"}}
CHILD_TEST = """\
import statistics, pwd
statistics.mean([1.0])
pwd.getpwuid(0)
subprocess.run(["git", "-c", "safe.directory=*", "-C", "/app/repo", "status"], capture_output=True)
subprocess.run(["awk", "BEGIN{}"])
"""


def test_an_idle_recovery_child_of_a_hooked_parent_fails(tmp_path, backend):
    """Every hook above planted before the pre-verifier snapshot; a child started from it that
    does nothing is verified: no pass, and no hook ran."""
    task = make_task(tmp_path, "child", CHILD_TEST, package=True)
    config = sandbox_config(task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as parent:
        prepare(task, parent, backend)
        agent(parent, "\n".join(HOOKS.values()))
        snap = parent.snapshot()
        with parent.fork(snap) as child:
            result = verify(task, child)
            ran = {m.removeprefix("hook-") for m in present(child, [f"hook-{h}" for h in HOOKS])}
    assert not result.strict_pass, f"an idle child passed on {backend}:\n{result.log}"
    assert ran <= MAY_RUN[backend], f"hooks planted in the parent ran in the child's verifier " \
        f"on {backend}: {sorted(ran)}"


def test_a_tb1_collection_error_is_a_failed_check_not_a_crash(tmp_path):
    """Honest side of the exit-status rule: a TB1 script's pytest stops with status 2 after a
    collection error (no --continue-on-collection-errors); that is its word, a failure."""
    d = write_tb1(tmp_path, "collect-error", "pytest $TEST_DIR/test_outputs.py -rA")
    (d / "tests" / "test_outputs.py").write_text("import agent_module_never_written\n\n\n"
                                                  "def test_answer():\n    pass\n")
    task = load_task(d)
    result, _, _ = attack("local", task, "true")
    assert result.error is None and not result.strict_pass, (result.error, result.error_detail)
    assert [c.outcome for c in result.checks] == ["error"], result.checks


def test_a_reterm_recovery_episode_that_does_nothing_earns_no_pass(tmp_path, backend):
    """The real ReTerm path: an actor episode plants every hook and fails (its snapshot taken
    before the verifier), then a recovery episode from that snapshot says DONE at once."""
    from tr.agent.harness import EpisodeSpec, run_episode
    from tr.agent.rollout import TaskEnv, discard_snapshot_ref
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer
    task = make_task(tmp_path, "reterm", CHILD_TEST, package=True)
    env = TaskEnv(backend, SandboxConfig(**SMALL))
    layout = ChatLayout(ByteTokenizer())
    actor = run_episode(EpisodeSpec(task=task, episode_id="actor"),
                        Says(["\n".join(HOOKS.values())]), env, layout,
                        snapshot_before_verify=True, policy_name="says")
    try:
        assert actor.status.counts and not actor.passed and actor.snapshot_ref, actor.error
        child = run_episode(EpisodeSpec(task=task, episode_id="child", parent=actor),
                            Says([]), env, layout, policy_name="idle")
    finally:
        discard_snapshot_ref(actor.snapshot_ref)
    assert child.kind == "recovery" and not child.passed, (child.status, child.error)
