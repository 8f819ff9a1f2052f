"""Verifier results: scenario checks, matched count P, executed, strict pass S (SPEC §5).

Parsing is pure (text in, result out): pytest runs are read from their JUnit XML report, never
from stdout; reward-file verifiers from `reward.txt` / `reward.json`. Running a verifier inside a
sandbox lives in `tr.envs.tasks.runner`; this module only turns its outputs into a result.

    P = (scenario checks passed) - (penalty checks failed)
    executed = scenario checks that ran (passed, failed or errored)
    S = no verifier error  and  every required check ran and passed
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Iterable

PENALTY_PREFIX = "test_penalty_"
JUNIT_FILENAME = "junit.xml"
REWARD_FILENAMES = ("reward.txt", "reward.json")

# Verifier failures, as distinct from the agent failing.
ERROR_TIMEOUT = "timeout"  # the verifier ran past its time limit
ERROR_CRASH = "crash"  # pytest / the test script ran nothing or died
ERROR_PARSE = "parse_error"  # no or unreadable report / reward file
ERROR_ENVIRONMENT = "environment"  # the task's environment could not be laid down
ERRORS = (ERROR_TIMEOUT, ERROR_CRASH, ERROR_PARSE, ERROR_ENVIRONMENT)


@dataclass(frozen=True)
class Check:
    """One check of a verifier run."""

    name: str
    passed: bool
    required: bool
    penalty: bool = False
    outcome: str = "passed"  # passed | failed | error | skipped
    message: str = ""


@dataclass(frozen=True)
class VerifierResult:
    """The verdict of one verifier run; JSON-serialisable with stable (sorted) keys."""

    checks: tuple[Check, ...]
    matched: int
    executed: int
    strict_pass: bool
    duration_s: float = 0.0
    log: str = ""
    error: str | None = None
    error_detail: str = ""
    reward: float | None = None
    task_id: str = ""
    family: str = ""
    tier: str = ""
    notes: tuple[str, ...] = ()   # how the environment differs from the task's own (a stand-in
    #                               base image, skipped installs), one line each

    @property
    def failed_verifier(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["checks"] = [dataclasses.asdict(c) for c in self.checks]
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> "VerifierResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"VerifierResult: unknown fields {unknown}")
        data = dict(data)
        data["checks"] = tuple(Check(**c) for c in data.get("checks", ()))
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "VerifierResult":
        return cls.from_dict(json.loads(text))

    def with_task(self, task_id: str, family: str, tier: str) -> "VerifierResult":
        return dataclasses.replace(self, task_id=task_id, family=family, tier=tier)


def failure(error: str, detail: str, *, log: str = "", duration_s: float = 0.0) -> VerifierResult:
    """A verifier that failed itself: no checks, P = executed = 0, S = false."""
    if error not in ERRORS:
        raise ValueError(f"unknown verifier error kind {error!r}; expected one of {ERRORS}")
    return VerifierResult(
        checks=(), matched=0, executed=0, strict_pass=False, duration_s=duration_s, log=log,
        error=error, error_detail=detail,
    )


# ---------------------------------------------------------------- pytest / JUnit XML


@dataclass(frozen=True)
class JUnitCase:
    """One <testcase> of a JUnit report, reduced to what scoring needs."""

    module: str  # file stem, e.g. "test_outputs"
    klass: str  # test class name, or ""
    name: str  # test name incl. parameters, e.g. "test_x[a-1]"
    outcome: str  # passed | failed | error | skipped
    message: str = ""
    collection_error: bool = False

    @property
    def function(self) -> str:
        return self.name.split("[", 1)[0]


def parse_junit_xml(text: str) -> list[JUnitCase]:
    """Parse a pytest JUnit XML report (xunit1 or xunit2) into cases; ValueError if unreadable."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"JUnit XML is not well-formed: {exc}") from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"JUnit XML root is <{root.tag}>, expected <testsuites> or <testsuite>")
    cases = []
    for element in root.iter("testcase"):
        cases.append(_case_from_element(element))
    return cases


def _case_from_element(element: ET.Element) -> JUnitCase:
    name = element.get("name", "")
    classname = element.get("classname", "")
    file_attr = element.get("file", "")
    outcome, message = "passed", ""
    for tag in ("error", "failure", "skipped"):
        child = element.find(tag)
        if child is not None:
            outcome = {"error": "error", "failure": "failed", "skipped": "skipped"}[tag]
            message = child.get("message", "") or (child.text or "")[:500]
            break
    if not classname and outcome == "error" and "collection" in message:
        module = name.rsplit(".", 1)[-1] or name
        return JUnitCase(module, "", "collection", "error", message, collection_error=True)
    module, klass = _split_classname(classname, file_attr)
    return JUnitCase(module, klass, name, outcome, message)


def _split_classname(classname: str, file_attr: str) -> tuple[str, str]:
    """`tests.test_io.TestX` -> ("test_io", "TestX"); the file attribute wins when present."""
    parts = [p for p in classname.split(".") if p]
    if file_attr:
        stem = file_attr.replace("\\", "/").rsplit("/", 1)[-1]
        stem = stem[:-3] if stem.endswith(".py") else stem
        if stem in parts:
            index = len(parts) - 1 - parts[::-1].index(stem)
            return stem, ".".join(parts[index + 1:])
        return stem, ""
    # Without a file attribute: trailing CamelCase components are classes.
    klass_parts: list[str] = []
    while parts and parts[-1][:1].isupper():
        klass_parts.insert(0, parts.pop())
    return (parts[-1] if parts else ""), ".".join(klass_parts)


def score_cases(
    cases: Iterable[JUnitCase],
    *,
    final_gate: str | None = None,
    required: Iterable[str] | None = None,
) -> tuple[tuple[Check, ...], int, int, bool]:
    """Checks, P, executed and S from parsed cases (rules in tr/envs/tasks/LAYOUT_TR.md).

    `final_gate` and `required` name checks by function name or full check name.
    """
    cases = list(cases)
    multi_file = len({c.module for c in cases}) > 1
    required_names = None if required is None else set(required)
    checks = []
    for case in cases:
        prefix = f"{case.module}::" if (multi_file or case.collection_error) else ""
        klass = f"{case.klass}::" if case.klass else ""
        full = f"{prefix}{klass}{case.name}"
        penalty = case.function.startswith(PENALTY_PREFIX) and not case.collection_error
        names = {full, case.name, case.function, f"{klass}{case.name}", f"{klass}{case.function}"}
        if required_names is None or penalty:
            is_required = True
        else:
            is_required = bool(names & (required_names | {final_gate} - {None}))
        checks.append(
            Check(
                name=full, passed=case.outcome == "passed", required=is_required,
                penalty=penalty, outcome=case.outcome, message=case.message[:500],
            )
        )
    checks.sort(key=lambda c: c.name)
    scenario = [c for c in checks if not c.penalty]
    executed = sum(c.outcome != "skipped" for c in scenario)
    matched = sum(c.passed for c in scenario) - sum(not c.passed and c.outcome != "skipped"
                                                     for c in checks if c.penalty)
    gate_present = final_gate is None or any(
        _matches(c.name, final_gate) for c in checks
    )
    strict = bool(checks) and gate_present and all(c.passed for c in checks if c.required)
    return tuple(checks), matched, executed, strict


def _matches(check_name: str, wanted: str) -> bool:
    last = check_name.rsplit("::", 1)[-1]
    return wanted in (check_name, last, last.split("[", 1)[0])


# ---------------------------------------------------------------- the runner's own word

COLLECTED_FILENAME = "collected.json"     # node ids the harness's pytest plugin collected
COLLECTED_MARK = "[tr-collected]"          # "<mark> <count> <sha256 of the json>" on the output
EXIT_MARK = "[tr-pytest-exit]"             # "<mark> <status>" after each served pytest run
RUNNER_EXITS = (0, 1)                      # pytest's and checkrun's own verdicts
PYTEST_INTERRUPTED = 2                     # also its word when the report has a collection error


def collected_key(node_id: str) -> tuple[str, str, str]:
    """``sub/test_a.py::TestX::test_y[p]`` -> ("test_a", "TestX", "test_y[p]"): the
    (module, class, name) a JUnit case of it parses to."""
    path, _, rest = node_id.partition("::")
    parts = rest.split("::") if rest else [""]
    stem = path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    return stem, ".".join(parts[:-1]), parts[-1]


def runner_word_problem(cases: list[JUnitCase], *, exit_code: int | None,
                        collected: list[str] | None) -> str | None:
    """Why a report is not the runner's own word (None when it is).  ``exit_code``: the
    harness's runner's exit status (None: not known, not checked); ``collected``: the node ids
    its plugin collected (None: not checked).

    * a status other than 0 or 1 is a crash or a kill (pytest's 2-5 included; 2 with a
      collection error in the report is pytest stopping there, as good as 1);
    * 0 holds only if no case failed or errored, 1 only if one did;
    * every collected test is in the report and every case of the report was collected (a case
      missing, or from a file outside the tests, is not the runner's).
    """
    bad = [c for c in cases if c.outcome in ("failed", "error")]
    if exit_code == PYTEST_INTERRUPTED and any(c.collection_error for c in cases):
        exit_code = 1       # pytest stops after a collection error unless told to go on
    if exit_code is not None:
        if exit_code not in RUNNER_EXITS:
            return (f"the test runner ended with exit status {exit_code}, not 0 or 1 (a crash "
                    "or a kill): its report is not its verdict")
        if exit_code == 0 and bad:
            return (f"the test runner exited 0 but its report has {len(bad)} failing case(s), "
                    f"e.g. {bad[0].module}::{bad[0].name}")
        if exit_code == 1 and not bad:
            return "the test runner exited 1 (a test failed) but its report has no failing case"
    if collected is not None:
        outside = [i for i in collected if i.startswith(("/", "../"))]
        if outside:
            return f"the test runner collected {outside[0]!r}, outside the task's tests"
        want = {collected_key(i) for i in collected}
        have = {(c.module, c.klass, c.name) for c in cases if not c.collection_error}
        if want - have:
            missing = "::".join(sorted(want - have)[0])
            return (f"{len(want - have)} collected test(s) are missing from the report, e.g. "
                    f"{missing}")
        if have - want:
            extra = "::".join(sorted(have - want)[0])
            return f"the report has {len(have - want)} case(s) the runner never collected, e.g. {extra}"
    return None


def runner_records(marks: Iterable[str]) -> tuple[list[int], list[tuple[int, str]], bool]:
    """(exit statuses, (count, digest) of collections, overflowed) from the marks of a run's
    output (:attr:`tr.envs.sandbox.CommandResult.marks`); an unreadable record is status -1."""
    exits, collections, overflow = [], [], False
    for line in marks:
        words = line.split()
        if line.startswith("[tr-marks-overflow]"):
            overflow = True
        elif words[:1] == [EXIT_MARK]:
            exits.append(int(words[1]) if len(words) == 2 and words[1].isdigit() else -1)
        elif words[:1] == [COLLECTED_MARK]:
            ok = len(words) == 3 and words[1].isdigit()
            collections.append((int(words[1]), words[2]) if ok else (-1, ""))
    return exits, collections, overflow


def collected_ids(text: str | None, collections: list[tuple[int, str]]) -> list[str] | str:
    """The collected node ids of ``collected.json``, checked against the runner's printed
    digests (the last run's); a str says why they cannot be trusted."""
    import hashlib

    if text is None:
        return f"the harness's pytest wrote no {COLLECTED_FILENAME}"
    if not collections:
        return "the harness's pytest printed no record of what it collected"
    count, digest = collections[-1]
    if hashlib.sha256(text.encode()).hexdigest() != digest:
        return f"{COLLECTED_FILENAME} is not what the harness's pytest collected"
    try:
        ids = json.loads(text)
    except json.JSONDecodeError:
        return f"{COLLECTED_FILENAME} is not valid JSON"
    if not isinstance(ids, list) or len(ids) != count or not all(isinstance(i, str) for i in ids):
        return f"{COLLECTED_FILENAME} does not list {count} node ids"
    return ids


def result_from_junit(
    junit_text: str | None,
    *,
    exit_code: int | None,
    timed_out: bool,
    log: str = "",
    duration_s: float = 0.0,
    final_gate: str | None = None,
    required: Iterable[str] | None = None,
    check_exit: bool = False,
    collected: list[str] | str | None = None,
) -> VerifierResult:
    """Turn one pytest run (its JUnit report and exit status) into a VerifierResult.

    ``check_exit``: ``exit_code`` is the harness's runner's own (not a script's): the report
    stands only as its word (:func:`runner_word_problem`); ``collected``: the node ids it
    collected (a str: why they are unknown -- a crash)."""
    if timed_out:
        return failure(ERROR_TIMEOUT, "the verifier ran past its time limit", log=log,
                       duration_s=duration_s)
    if junit_text is None:
        kind = ERROR_CRASH if exit_code not in (0, 1) else ERROR_PARSE
        return failure(kind, f"pytest wrote no JUnit report (exit code {exit_code})", log=log,
                       duration_s=duration_s)
    try:
        cases = parse_junit_xml(junit_text)
    except ValueError as exc:
        return failure(ERROR_PARSE, str(exc), log=log, duration_s=duration_s)
    if not cases:
        return failure(ERROR_CRASH, f"pytest ran no tests (exit code {exit_code})", log=log,
                       duration_s=duration_s)
    if isinstance(collected, str):
        return failure(ERROR_CRASH, collected, log=log, duration_s=duration_s)
    problem = runner_word_problem(cases, exit_code=exit_code if check_exit else None,
                                  collected=collected)
    if problem:
        return failure(ERROR_CRASH, problem, log=log, duration_s=duration_s)
    checks, matched, executed, strict = score_cases(cases, final_gate=final_gate, required=required)
    return VerifierResult(checks=checks, matched=matched, executed=executed, strict_pass=strict,
                          duration_s=duration_s, log=log)


# ---------------------------------------------------------------- a test script's printed summary

OUTPUT_FILENAME = "output.txt"
_SUMMARY = re.compile(r"^=+ short test summary info =+\s*$", re.M)
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", re.M)


def parse_summary(text: str) -> list[JUnitCase]:
    """Cases from the last `short test summary info` block of a test script's output (what
    Terminal-Bench 1's PytestParser reads): lines `PASSED name`, `FAILED name - why`, ..."""
    starts = [m.end() for m in _SUMMARY.finditer(text)]
    if not starts:
        raise ValueError("the output has no '=== short test summary info ===' line")
    cases = []
    outcome_of = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "error",
                  "SKIPPED": "skipped", "XFAIL": "skipped"}
    for m in _SUMMARY_LINE.finditer(text[starts[-1]:]):
        path, _, name = m.group(2).rpartition("::")
        stem = path.rsplit("/", 1)[-1].removesuffix(".py") if path else ""
        cases.append(JUnitCase(stem, "", name or m.group(2), outcome_of[m.group(1)]))
    return cases


def result_from_summary(output: str | None, *, exit_code: int | None, timed_out: bool,
                        duration_s: float = 0.0) -> VerifierResult:
    """A test script that does not run pytest, judged from its printed summary (above)."""
    log = (output or "")[-20000:]
    if timed_out:
        return failure(ERROR_TIMEOUT, "the verifier ran past its time limit", log=log,
                       duration_s=duration_s)
    try:
        cases = parse_summary(output or "")
    except ValueError as exc:
        return failure(ERROR_PARSE, f"{exc} (exit code {exit_code})", log=log,
                       duration_s=duration_s)
    if not cases:
        return failure(ERROR_PARSE, f"the summary names no test (exit code {exit_code})", log=log,
                       duration_s=duration_s)
    checks, matched, executed, strict = score_cases(cases)
    return VerifierResult(checks=checks, matched=matched, executed=executed, strict_pass=strict,
                          duration_s=duration_s, log=log)


# ---------------------------------------------------------------- reward files


def parse_reward(filename: str, text: str) -> float:
    """Read a Harbor reward file: `reward.txt` holds a number, `reward.json` {"reward": x}."""
    if filename.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{filename} is not valid JSON: {exc}") from exc
        if isinstance(data, dict):
            if "reward" in data:
                value = data["reward"]
            elif len(data) == 1:
                (value,) = data.values()
            else:
                raise ValueError(f"{filename} has no 'reward' key (keys: {sorted(data)})")
        else:
            value = data
    else:
        value = text.strip()
    if isinstance(value, bool):
        raise ValueError(f"{filename}: reward is a boolean, expected a number")
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{filename}: reward {str(value)[:40]!r} is not a number") from None
    if not math.isfinite(reward):
        raise ValueError(f"{filename}: reward {reward} is not finite")
    return reward


def result_from_reward(
    files: dict[str, str],
    *,
    exit_code: int | None,
    timed_out: bool,
    log: str = "",
    duration_s: float = 0.0,
) -> VerifierResult:
    """One synthetic check `reward`, passed (and strict) iff reward >= 1; P = 1 or 0."""
    if timed_out:
        return failure(ERROR_TIMEOUT, "the verifier ran past its time limit", log=log,
                       duration_s=duration_s)
    for filename in REWARD_FILENAMES:
        if filename in files:
            try:
                reward = parse_reward(filename, files[filename])
            except ValueError as exc:
                return failure(ERROR_PARSE, str(exc), log=log, duration_s=duration_s)
            passed = reward >= 1.0
            check = Check(name="reward", passed=passed, required=True,
                          outcome="passed" if passed else "failed", message=f"reward={reward:g}")
            return VerifierResult(checks=(check,), matched=int(passed), executed=1,
                                  strict_pass=passed, duration_s=duration_s, log=log,
                                  reward=reward)
    return failure(ERROR_PARSE, f"the test script wrote no reward.txt or reward.json "
                   f"(exit code {exit_code})", log=log, duration_s=duration_s)
