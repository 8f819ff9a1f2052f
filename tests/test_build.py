"""BUILD cannot rot: every module and test file is declared, and every declared file exists.

Where a `bazel` binary is installed (`TR_BAZEL=1 bash launch/setup.sh`), Bazel itself also reads
BUILD: `bazel query //...` must list exactly the targets read here, and one `bazel test` runs.
"""

import fnmatch
import os
import pathlib
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from pytest_main import pytest_args, real_paths  # tests/ is on the path (pytest puts the test's folder there)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("tr", "experiments", "launch", "bench")


def _glob(patterns, exclude=()):
    """Bazel's glob over the repository: `**` spans directories."""
    found = set()
    for pattern in patterns:
        for path in ROOT.glob(pattern):
            if path.is_file():
                found.add(path.relative_to(ROOT).as_posix())
    return sorted(p for p in found if not any(fnmatch.fnmatch(p, e) for e in exclude))


def load_build(path=ROOT / "BUILD"):
    """Evaluates the Starlark BUILD file (plain calls only) and returns its rules."""
    rules = []

    def rule(kind):
        def record(**kwargs):
            rules.append(dict(kind=kind, **kwargs))
        return record

    namespace = {
            "py_library": rule("py_library"),
            "py_test": rule("py_test"),
            "py_binary": rule("py_binary"),
            "filegroup": rule("filegroup"),
            "glob": _glob,
            "load": lambda *args, **kwargs: None,
            "package": lambda **kwargs: None,
    }
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # pylint: disable=exec-used
    return rules


@pytest.fixture(scope="module")
def rules():
    return load_build()


def _declared(rules, kinds, field="srcs"):
    return {src for r in rules if r["kind"] in kinds for src in r.get(field, [])}


def test_every_module_is_declared_in_a_library_or_binary(rules):
    declared = _declared(rules, {"py_library", "py_binary"})
    modules = {
            p.relative_to(ROOT).as_posix()
            for root in SOURCE_ROOTS
            for p in (ROOT / root).rglob("*.py")
            if "suite" not in p.relative_to(ROOT).parts  # task data, declared as data below
    }
    missing = sorted(modules - declared)
    assert not missing, f"modules missing from BUILD srcs: {missing}"


def test_every_test_file_has_a_py_test(rules):
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")}
    declared = _declared(rules, {"py_test"})
    missing = sorted(tests - declared)
    assert not missing, f"test files without a py_test in BUILD: {missing}"


def test_test_support_modules_are_declared(rules):
    support = {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / "tests").glob("*.py")
            if not p.name.startswith("test_")
    }
    declared = _declared(rules, {"py_library", "py_test"})
    missing = sorted(support - declared)
    assert not missing, f"test support modules missing from BUILD: {missing}"


def test_every_declared_file_exists(rules):
    declared = (
            _declared(rules, {"py_library", "py_binary", "py_test", "filegroup"})
            | _declared(rules, {"py_library", "py_binary", "py_test", "filegroup"}, "data"))
    absent = sorted(p for p in declared if not p.startswith(":") and not (ROOT / p).is_file())
    assert not absent, f"BUILD declares files that do not exist: {absent}"


def test_deps_name_declared_targets(rules):
    names = {r["name"] for r in rules}
    for r in rules:
        for dep in r.get("deps", []):
            if dep.startswith(":"):
                assert dep[1:] in names, f"{r['name']} depends on undeclared target {dep}"


def test_dependency_graph_has_no_cycles(rules):
    """Bazel refuses cyclic deps; so do we (a cycle also means two rooms import each other)."""
    graph = {r["name"]: [d[1:] for d in r.get("deps", []) if d.startswith(":")] for r in rules}
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"dependency cycle: {' -> '.join(path + [node])}"
        state[node] = "open"
        for dep in graph.get(node, []):
            visit(dep, path + [node])
        state[node] = "done"

    for name in graph:
        visit(name, [])


def test_loader_detects_an_undeclared_module(tmp_path):
    """The check itself can fail: a BUILD that forgets a file is caught."""
    build = tmp_path / "BUILD"
    build.write_text('py_library(name = "rl", srcs = ["tr/rl/__init__.py"])\n')
    declared = _declared(load_build(build), {"py_library"})
    assert "tr/rl/advantages.py" not in declared


def test_pytest_main_passes_bazels_test_protocol_to_pytest():
    assert pytest_args(["/r/tests/test_x.py"], {}, "/r") == [
            "-q", "-p", "no:cacheprovider", "--rootdir=/r", "/r/tests/test_x.py"]
    args = pytest_args(["/r/tests/test_x.py"], {"XML_OUTPUT_FILE": "/o/test.xml",
                                                "TESTBRIDGE_TEST_ONLY": "Loss and not slow"}, "/r")
    assert args[-3:] == ["--junitxml=/o/test.xml", "-k", "Loss and not slow"]


def test_pytest_main_finds_the_real_files_behind_runfiles_links(tmp_path, monkeypatch):
    checkout, runfiles = tmp_path / "checkout", tmp_path / "runfiles"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "test_x.py").write_text("")
    (runfiles / "tests").mkdir(parents=True)
    (runfiles / "tests" / "test_x.py").symlink_to(checkout / "tests" / "test_x.py")
    monkeypatch.chdir(runfiles)
    assert real_paths(["tests/test_x.py"]) == ([str(checkout / "tests" / "test_x.py")], str(checkout))


# Bazel runs from here only outside Bazel (a test run by `bazel test` must not start Bazel again).
needs_bazel = pytest.mark.skipif(
        shutil.which("bazel") is None or "TEST_SRCDIR" in os.environ,
        reason="no bazel binary (TR_BAZEL=1 bash launch/setup.sh installs Debian's bazel-bootstrap)")


@pytest.fixture(scope="module")
def bazel(tmp_path_factory):
    """Runs bazel in the repository with its own output base, removed with its server at the end.

    Its own output base keeps a user's Bazel server and convenience symlinks untouched.
    """
    output_base = tmp_path_factory.mktemp("bazel") / "output_base"
    startup = ["bazel", "--nohome_rc", f"--output_base={output_base}", "--max_idle_secs=60"]

    def run(*args, check=True):
        done = subprocess.run(startup + list(args), cwd=ROOT, capture_output=True, text=True,
                              timeout=900, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"bazel {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done

    run.output_base = output_base
    yield run
    # `clean --expunge` stops the server and deletes the output base (the prefix `/` leaves the
    # workspace's convenience symlinks alone); if it fails, at least stop the server.
    if run("clean", "--expunge", "--symlink_prefix=/", check=False).returncode != 0:
        run("shutdown", check=False)
    shutil.rmtree(output_base, ignore_errors=True)


@needs_bazel
def test_bazel_query_lists_exactly_the_targets_of_build(bazel, rules):
    listed = bazel("query", "//...", "--output=label").stdout.split()
    assert sorted(listed) == sorted(f"//:{r['name']}" for r in rules)


@needs_bazel
def test_bazel_test_runs_a_test_file_under_pytest(bazel):
    """One real `bazel test`, offline: the .venv toolchain, the pytest driver, the JUnit report."""
    done = bazel("test", "//:test_losses", "--test_filter=SftLossTest", "--nocache_test_results",
                 "--symlink_prefix=/", "--jobs=2", "--local_test_jobs=1")
    assert "1 test passes" in done.stderr + done.stdout
    report = next(bazel.output_base.glob("execroot/*/bazel-out/*/testlogs/test_losses/test.xml"))
    cases = list(ET.parse(report).iter("testcase"))
    assert cases and all(c.get("classname").endswith("SftLossTest") for c in cases)
    assert not [c for c in cases if len(c)], "a case failed, errored or was skipped"
