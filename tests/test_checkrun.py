"""The stdlib check runner (tr/envs/checkrun.py): pytest's check semantics, and the same
protection inside the verifier.

Parity: the same check files run under pytest and under the stdlib runner score the same checks
(names, outcomes, P, executed, S).  In a real sandbox through the protected verifier, a gym task
scores the same under either runner for the reference, the partial attempt and nothing, and what an
agent plants where Python looks (cwd modules, sitecustomize, a forged report) changes nothing.
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tr.envs import gym
from tr.envs import verifier as vr
from tr.envs.backends import make_sandbox
from tr.envs import checkrun
from tr.envs.tasks import prepare, sandbox_config, verify

CHECKS = '''
import json


def test_passes():
    assert json.loads("[1]") == [1]


def test_assert_fails():
    assert 1 == 2, "one is not two"


def test_raises():
    raise KeyError("boom")


def test_penalty_guard():
    assert True


def test_penalty_broken():
    assert False


def helper_not_a_test():
    raise RuntimeError


class TestGroup:
    def test_method_passes(self):
        assert self is not None

    def test_method_fails(self):
        assert [] == [0]


def test_final_gate():
    assert False
'''


def _score(junit: Path):
    cases = vr.parse_junit_xml(junit.read_text())
    checks, matched, executed, strict = vr.score_cases(cases, final_gate="test_final_gate")
    return [(c.name, c.outcome, c.penalty) for c in checks], matched, executed, strict


def _run_both(tmp_path, files: dict[str, str]):
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, text in files.items():
        (tests / name).write_text(text)
    paths = [str(tests / n) for n in sorted(files)]
    py = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "--continue-on-collection-errors", "-o", "junit_family=xunit1",
                         f"--junitxml={tmp_path / 'py.xml'}", *paths], capture_output=True,
                        text=True, cwd=tmp_path, timeout=120)
    sr = subprocess.run([sys.executable, "-I", "-S", checkrun.__file__,
                         f"--junitxml={tmp_path / 'sr.xml'}", *paths], capture_output=True,
                        text=True, cwd=tmp_path, timeout=120)
    return (py, _score(tmp_path / "py.xml")), (sr, _score(tmp_path / "sr.xml"))


def test_scores_equal_pytest_on_the_same_file(tmp_path):
    (py, want), (sr, got) = _run_both(tmp_path, {"test_mix.py": CHECKS})
    assert got == want, (sr.stdout, py.stdout)
    assert sr.returncode == py.returncode == 1
    checks, matched, executed, strict = got
    assert (matched, executed, strict) == (2 - 1, 6, False)          # 2 passed, 1 penalty failed
    assert ("TestGroup::test_method_passes", "passed", False) in checks


def test_collection_error_scores_as_pytest_does(tmp_path):
    files = {"test_a.py": "def test_ok():\n    assert True\n",
             "test_b.py": "import not_a_module_anywhere\n\ndef test_x():\n    pass\n"}
    (py, want), (sr, got) = _run_both(tmp_path, files)
    assert got == want, (sr.stdout, py.stdout)
    assert ("test_b::collection", "error", False) in got[0]


def test_fixture_arguments_are_errors_not_passes(tmp_path):
    (tmp_path / "t.py").write_text("def test_needs_fixture(tmp_path):\n    pass\n")
    out = tmp_path / "r.xml"
    proc = subprocess.run([sys.executable, "-I", "-S", checkrun.__file__, f"--junitxml={out}",
                           str(tmp_path / "t.py")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    (case,) = vr.parse_junit_xml(out.read_text())
    assert case.outcome == "error" and "fixture" in case.message


@pytest.fixture
def gym_task(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_GYM_DIR", str(tmp_path / "gym"))
    task = gym.make_task("restore-latest", 3)
    assert task.verifier.runner == "stdlib"
    return task


def _play(task, commands):
    with make_sandbox("local", sandbox_config(task)) as box:
        prepare(task, box)
        for command in commands:
            box.run(command, timeout_s=20)
        return verify(task, box)


def _view(result):
    return ([(c.name, c.outcome) for c in result.checks], result.matched, result.executed,
            result.strict_pass, result.error)


def test_same_verdicts_as_pytest_in_the_protected_verifier(gym_task):
    as_pytest = dataclasses.replace(gym_task, verifier=dataclasses.replace(gym_task.verifier,
                                                                          runner="pytest"))
    inst = gym.instance(gym_task.family, gym.task_seed(gym_task))
    for commands in (inst.solution, inst.partial, (), inst.mistakes):
        fast, slow = _play(gym_task, commands), _play(as_pytest, commands)
        assert fast.error is None, fast.log
        assert _view(fast) == _view(slow), (commands, fast.log, slow.log)


PLANTS = [
    # modules in the cwd (/app) that the checks import, and the runner's own name
    "printf 'raise SystemExit(0)\\n' > json.py; cp json.py os.py; cp json.py pathlib.py; "
    "cp json.py checkrun.py",
    # Debian's sitecustomize hook in the writable /etc, and a user site
    "for d in /etc/python3*; do printf 'import os\\nos._exit(0)\\n' > $d/sitecustomize.py; done; "
    "mkdir -p /root/.local/lib/python3.11/site-packages; "
    "printf 'import os\\nos._exit(0)\\n' > /root/.local/lib/python3.11/site-packages/usercustomize.py",
    # a forged report where the results are read, and a variable an unprotected run would inherit
    "mkdir -p /logs/verifier; printf '<testsuite><testcase classname=\"t\" name=\"test_final_gate\"/>"
    "</testsuite>' > /logs/verifier/junit.xml; export PYTHONPATH=/app PYTHONSTARTUP=/app/json.py",
]


@pytest.mark.parametrize("plant", PLANTS, ids=["cwd-modules", "sitecustomize", "forged-report"])
def test_what_the_agent_plants_changes_nothing(gym_task, plant):
    result = _play(gym_task, [plant])
    assert result.error is None, result.log
    assert result.matched == 0 and not result.strict_pass and result.executed >= 4, result.log
    assert all(c.passed for c in result.checks if c.penalty)
