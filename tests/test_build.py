"""BUILD cannot rot: every module and test file is declared, and every declared file exists."""

import fnmatch
import pathlib

import pytest

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
