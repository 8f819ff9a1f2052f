"""Verifier results: scoring from real pytest JUnit reports and reward files, JSON stability."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tr.envs import verifier as vr

MIXED = textwrap.dedent(
    """
    import pytest

    def test_a():
        assert True

    def test_b():
        assert False, "b is wrong"

    def test_penalty_inputs_kept():
        assert False

    def test_penalty_tool_works():
        assert True

    @pytest.mark.skip(reason="not today")
    def test_skipped():
        pass

    @pytest.mark.parametrize("x", [1, 2])
    def test_param(x):
        assert x == 1

    def test_error_in_fixture(missing_fixture):
        pass

    def test_final_gate():
        assert True
    """
)


def run_pytest(tmp_path, files: dict[str, str], family: str = "xunit1") -> tuple[str, int]:
    """Run real pytest on `files` in tmp_path; return (JUnit XML text, exit code)."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, text in files.items():
        (tests / name).write_text(text)
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--continue-on-collection-errors", "-o", f"junit_family={family}",
         f"--junitxml={junit}", str(tests)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    return junit.read_text(), proc.returncode


def reference_score(outcomes: dict[str, str], required: set[str] | None = None):
    """The obvious reading of the rules: outcomes {check name: passed|failed|error|skipped}."""
    penalty = {n for n in outcomes if n.split("::")[-1].startswith("test_penalty_")}
    scenario = [n for n in outcomes if n not in penalty]
    passed = sum(outcomes[n] == "passed" for n in scenario)
    executed = sum(outcomes[n] != "skipped" for n in scenario)
    penalties = sum(outcomes[n] in ("failed", "error") for n in penalty)
    req = set(outcomes) if required is None else (required | penalty)
    strict = bool(outcomes) and all(outcomes[n] == "passed" for n in req)
    return passed - penalties, executed, strict


@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_real_pytest_report_scores_like_the_reference(tmp_path, family):
    xml, code = run_pytest(tmp_path, {"test_mixed.py": MIXED}, family)
    assert code == 1
    result = vr.result_from_junit(xml, exit_code=code, timed_out=False, final_gate="test_final_gate")
    outcomes = {c.name: c.outcome for c in result.checks}
    assert outcomes == {
        "test_a": "passed", "test_b": "failed", "test_penalty_inputs_kept": "failed",
        "test_penalty_tool_works": "passed", "test_skipped": "skipped", "test_param[1]": "passed",
        "test_param[2]": "failed", "test_error_in_fixture": "error", "test_final_gate": "passed",
    }
    matched, executed, strict = reference_score(outcomes)
    assert (result.matched, result.executed, result.strict_pass) == (matched, executed, strict)
    assert (result.matched, result.executed) == (3 - 1, 6)
    assert result.error is None
    assert {c.name for c in result.checks if c.penalty} == {"test_penalty_inputs_kept",
                                                            "test_penalty_tool_works"}
    assert "b is wrong" in next(c.message for c in result.checks if c.name == "test_b")


def test_all_passing_is_strict_and_required_subset_ignores_others(tmp_path):
    files = {"test_ok.py": "def test_x():\n    pass\n\ndef test_gate():\n    pass\n\n"
                           "def test_extra():\n    assert 0\n"}
    xml, code = run_pytest(tmp_path, files)
    everything = vr.result_from_junit(xml, exit_code=code, timed_out=False, final_gate="test_gate")
    assert not everything.strict_pass and everything.matched == 2 and everything.executed == 3
    subset = vr.result_from_junit(xml, exit_code=code, timed_out=False, final_gate="test_gate",
                                  required=["test_x"])
    assert subset.strict_pass
    assert {c.name for c in subset.checks if c.required} == {"test_x", "test_gate"}
    gate_only = vr.result_from_junit(xml, exit_code=code, timed_out=False, final_gate="test_extra",
                                     required=[])
    assert not gate_only.strict_pass


def test_missing_final_gate_is_never_strict(tmp_path):
    xml, code = run_pytest(tmp_path, {"test_ok.py": "def test_x():\n    pass\n"})
    assert vr.result_from_junit(xml, exit_code=code, timed_out=False).strict_pass
    assert not vr.result_from_junit(xml, exit_code=code, timed_out=False,
                                    final_gate="test_gate").strict_pass


def test_several_files_classes_and_collection_errors(tmp_path):
    files = {
        "test_one.py": "class TestThing:\n    def test_x(self):\n        pass\n",
        "test_two.py": "def test_x():\n    assert 0\n",
        "test_broken.py": "import module_the_agent_never_wrote\n\ndef test_y():\n    pass\n",
    }
    xml, code = run_pytest(tmp_path, files)
    result = vr.result_from_junit(xml, exit_code=code, timed_out=False)
    outcomes = {c.name: c.outcome for c in result.checks}
    assert outcomes == {"test_one::TestThing::test_x": "passed", "test_two::test_x": "failed",
                        "test_broken::collection": "error"}
    assert (result.matched, result.executed, result.strict_pass) == (1, 3, False)
    assert result.error is None  # a test file that cannot import is the agent's failure


def test_penalties_can_make_matched_negative(tmp_path):
    files = {"test_p.py": "def test_penalty_a():\n    assert 0\n\ndef test_penalty_b():\n"
                          "    assert 0\n\ndef test_c():\n    assert 0\n"}
    xml, code = run_pytest(tmp_path, files)
    result = vr.result_from_junit(xml, exit_code=code, timed_out=False)
    assert (result.matched, result.executed, result.strict_pass) == (-2, 1, False)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["test_a", "test_b", "test_c", "test_penalty_x", "test_penalty_y",
                     "test_d[1]", "test_d[2]"]),
    st.sampled_from(["passed", "failed", "error", "skipped"]), min_size=1))
def test_scoring_matches_the_reference_for_any_outcomes(outcomes):
    cases = [vr.JUnitCase("test_m", "", name, outcome) for name, outcome in outcomes.items()]
    checks, matched, executed, strict = vr.score_cases(cases)
    assert (matched, executed, strict) == reference_score(outcomes)
    required = {n for n in outcomes if n.startswith("test_a")}
    *_, strict_subset = vr.score_cases(cases, required=required)
    assert strict_subset == reference_score(outcomes, required)[2]


@pytest.mark.parametrize(
    "junit, code, timed_out, error",
    [
        (None, None, True, "timeout"),
        (None, 0, False, "parse_error"),
        (None, 4, False, "crash"),
        ("<testsuites><testsuite", 1, False, "parse_error"),
        ("<html></html>", 1, False, "parse_error"),
        ('<testsuites><testsuite name="pytest" tests="0"/></testsuites>', 5, False, "crash"),
    ],
)
def test_verifier_failures_are_errors_not_agent_failures(junit, code, timed_out, error):
    result = vr.result_from_junit(junit, exit_code=code, timed_out=timed_out, log="LOG")
    assert result.error == error and result.failed_verifier
    assert (result.matched, result.executed, result.strict_pass, result.checks) == (0, 0, False, ())
    assert result.log == "LOG" and result.error_detail


@pytest.mark.parametrize(
    "files, reward, strict",
    [
        ({"reward.txt": "1\n"}, 1.0, True),
        ({"reward.txt": "0"}, 0.0, False),
        ({"reward.txt": " 0.5 "}, 0.5, False),
        ({"reward.json": '{"reward": 1.0}'}, 1.0, True),
        ({"reward.json": '{"score": 2}'}, 2.0, True),
        ({"reward.json": "0.25"}, 0.25, False),
    ],
)
def test_reward_files(files, reward, strict):
    result = vr.result_from_reward(files, exit_code=0, timed_out=False)
    assert result.error is None and result.reward == reward
    assert result.strict_pass == strict and result.matched == int(strict) and result.executed == 1
    assert [c.name for c in result.checks] == ["reward"]


@pytest.mark.parametrize(
    "files, needle",
    [
        ({}, "no reward.txt"),
        ({"reward.txt": "yes"}, "not a number"),
        ({"reward.txt": "nan"}, "not finite"),
        ({"reward.json": "{"}, "not valid JSON"),
        ({"reward.json": '{"a": 1, "b": 2}'}, "no 'reward' key"),
        ({"reward.json": '{"reward": true}'}, "boolean"),
    ],
)
def test_bad_reward_files_are_parse_errors(files, needle):
    result = vr.result_from_reward(files, exit_code=0, timed_out=False)
    assert result.error == "parse_error" and needle in result.error_detail


def test_json_round_trip_is_exact_and_stable(tmp_path):
    xml, code = run_pytest(tmp_path, {"test_mixed.py": MIXED})
    result = vr.result_from_junit(xml, exit_code=code, timed_out=False, log="log\n",
                                  duration_s=1.25).with_task("t-1", "fam", "hard")
    text = result.to_json()
    assert vr.VerifierResult.from_json(text) == result
    assert vr.VerifierResult.from_json(text).to_json() == text
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert list(data["checks"][0]) == sorted(data["checks"][0])
    for key in ("task_id", "family", "tier", "strict_pass", "matched", "executed", "checks", "error"):
        assert key in data
    with pytest.raises(ValueError, match="unknown fields"):
        vr.VerifierResult.from_dict({**data, "surprise": 1})


def test_failure_rejects_unknown_error_kinds():
    with pytest.raises(ValueError, match="unknown verifier error kind"):
        vr.failure("oops", "detail")
