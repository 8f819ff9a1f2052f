"""The import graph of `tr/` as LAYOUT.md draws it: no circle between modules, imports downward.

Every `tr/**/*.py` is parsed with `ast` (nothing is imported); every `import tr...` and
`from tr... import ...` counts, the ones inside functions included (a lazy import hides an edge
from the reader, not from the graph). `from tr.a import b` is an edge to `tr.a.b` when that is a
module, else to `tr.a`; relative imports are resolved against the importing module's package.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Which rooms (tr/<room>/) each room may import (itself always). LAYOUT.md, "Imports run downward".
ALLOWED_ROOMS = {
        "rl": {"rewards"},                  # pure maths on arrays; rl and rewards share types only
        "rewards": {"rl"},
        "models": set(),                    # no shells, tasks, sampling or training
        "sampling": {"models"},
        "envs": set(),                      # sandboxes, tasks, verifier, gym: no JAX, no models
        "agent": {"envs", "models", "sampling"},
        "data": {"agent"},
        "train": {"rl", "models"},
        "stages": {"rl", "rewards", "models", "sampling", "envs", "agent", "data", "train"},
}
# Outside libraries a room must not import (the module's top-level package name).
FORBIDDEN_LIBRARIES = {
        "envs": {"jax", "jaxlib", "flax", "optax", "orbax", "chex"},
        "rewards": {"flax", "optax", "orbax"},
        "rl": {"flax", "orbax"},
}
# The command line sits above every room (it may import any), like experiments/main.py.
ENTRY_MODULES = {
        "tr.cli": "the termrl command: runs, evaluates, serves and exports stages' checkpoints",
        "tr.__main__": "python -m tr is termrl",
}
# Who may import tr.stages from outside it: the entry point, and experiment configs and benchmarks
# that take a job's own defaults or helpers (reason given for each).
STAGES_IMPORTERS = {
        "experiments/main.py": "the entry point: resolves the config's job (tr.stages.registry)",
        "experiments/base_policy.py": "the Base job's settings are tr.stages.base.defaults",
        "experiments/terminal_rsi.py": "the ablation's arms and factors (tr.stages.terminal_rsi)",
        "bench/bench_packing.py": "benchmarks tr.stages.arrays.training_arrays itself",
        "bench/probe_recovery.py": "a probe of the ReTerm stage's recovery rollouts",
        "bench/rl_learning.py": "the RL learning benchmark trains with the stages' own runtime",
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def tr_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted((ROOT / "tr").rglob("*.py"))}


def imports_of(path: pathlib.Path, name: str, modules) -> tuple[set[str], set[str]]:
    """(the `tr` modules `path` imports, the top-level names of the other libraries it imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner, outer = set(), set()

    def add(target: str) -> None:
        if target == "tr" or target.startswith("tr."):
            inner.add(target)
        else:
            outer.add(target.split(".")[0])

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            if source == "tr" or source.startswith("tr."):
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    inner.add(full if full in modules else source)
            else:
                add(source)
    return inner, outer


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = tr_modules()
    graph, libraries = {}, {}
    for name, path in modules.items():
        inner, outer = imports_of(path, name, modules)
        missing = {m for m in inner if m not in modules}
        assert not missing, f"{path.relative_to(ROOT)} imports {sorted(missing)}, not modules of tr/"
        graph[name], libraries[name] = inner - {name}, outer
    return graph, libraries


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_circle_in_tr():
    graph, _ = import_graph()
    assert len(graph) > 100, "tr/ should have well over 100 modules"
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_rooms_import_downward_only():
    graph, libraries = import_graph()
    bad = []
    for module, targets in sorted(graph.items()):
        if module in ENTRY_MODULES:
            continue
        mine = room(module)
        if mine not in ALLOWED_ROOMS:
            assert not targets, f"{module} (outside every room) imports {sorted(targets)}"
            continue
        for target in sorted(targets):
            theirs = room(target)
            if theirs != mine and theirs not in ALLOWED_ROOMS[mine]:
                bad.append(f"{module} -> {target} ({mine}/ may import {sorted(ALLOWED_ROOMS[mine])})")
        for library in sorted(libraries[module] & FORBIDDEN_LIBRARIES.get(mine, set())):
            bad.append(f"{module} imports {library} ({mine}/ must not)")
    assert set(ALLOWED_ROOMS) == {room(m) for m in graph if room(m) and m not in ENTRY_MODULES}, \
        "a room is missing a rule"
    assert not bad, "imports against LAYOUT.md's layers:\n" + "\n".join(bad)


def test_only_the_entry_points_import_stages():
    files = sorted(p for folder in ("experiments", "bench", "launch")
                   for p in (ROOT / folder).rglob("*.py"))
    found, modules = set(), tr_modules()
    for path in files:
        inner, _ = imports_of(path, "outside", modules)
        if any(m == "tr.stages" or m.startswith("tr.stages.") for m in inner):
            found.add(path.relative_to(ROOT).as_posix())
    assert found <= set(STAGES_IMPORTERS), f"import tr.stages without a stated reason: " \
                                          f"{sorted(found - set(STAGES_IMPORTERS))}"
    assert "experiments/main.py" in found


@pytest.mark.parametrize("edges, want", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_the_circle_finder_against_hand_made_graphs(edges, want):
    assert sorted(circles(edges)) == want


def test_a_function_level_and_a_relative_import_are_edges(tmp_path):
    modules = {"tr.x.a": None, "tr.x.b": None, "tr.y": None}
    source = tmp_path / "a.py"
    source.write_text("import os\n\ndef f():\n    from tr.y import thing\n    from . import b\n"
                      "    import numpy.linalg\n")
    inner, outer = imports_of(source, "tr.x.a", modules)
    assert inner == {"tr.y", "tr.x.b"} and outer == {"os", "numpy"}


def private_crossings(path: pathlib.Path, name: str, modules) -> list[str]:
    """Private names (`_x`, not dunders) of another `tr` module that `path` uses: `from tr.m import
    _x`, and `m._x` where `m` is bound to a `tr` module by an import (`from tr import m`,
    `import tr.m as m`). A private name is its module's business: what others use is public API."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    private = lambda n: n.startswith("_") and not n.startswith("__")  # noqa: E731
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == "tr" or source.startswith("tr.")):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in modules:
                    aliases[alias.asname or alias.name] = full
                elif private(alias.name) and source != name:
                    found.append(f"line {node.lineno}: from {source} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tr.") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and private(node.attr) and aliases[node.value.id] != name):
            found.append(f"line {node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    modules = tr_modules()
    files = {name: path for name, path in modules.items()}
    files.update({module_name(p): p for folder in ("bench", "experiments")
                  for p in sorted((ROOT / folder).rglob("*.py"))})
    bad = [f"{path.relative_to(ROOT)} {use}" for name, path in sorted(files.items())
           for use in private_crossings(path, name, modules)]
    assert not bad, "private names used outside their module (make them public API):\n" + "\n".join(bad)


def test_the_private_name_finder_on_a_hand_made_module(tmp_path):
    modules = {"tr.x.a": None, "tr.x.b": None, "tr.y": None}
    source = tmp_path / "a.py"
    source.write_text("from tr.y import _hidden, shown\nfrom tr.x import b\nimport tr.y as why\n"
                      "def f():\n    from . import b as bee\n    return b._p, bee._q, why._r, b.ok, b.__doc__\n")
    assert private_crossings(source, "tr.x.a", modules) == [
        "line 1: from tr.y import _hidden", "line 6: tr.x.b._p", "line 6: tr.x.b._q",
        "line 6: tr.y._r"]


# The `tr` imports a function may make (everywhere else an import sits at the top of its file, where
# the reader sees what the module needs): file -> why its imports are lazy.
FUNCTION_LEVEL_IMPORTS = {
        "tr/cli.py": "the entry layer: each subcommand loads only its own rooms, so `termrl --help`, "
                     "`termrl tasks` and `termrl gym` start without JAX or the stages",
}


def function_level_imports(path: pathlib.Path) -> list[str]:
    """`line N: from tr.x import y` for every `tr` import inside a function of `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and (sub.level or (sub.module or "").split(".")[0] == "tr"):
                found.append(f"line {sub.lineno}: from {'.' * sub.level}{sub.module or ''} import "
                             f"{', '.join(a.name for a in sub.names)}")
            elif isinstance(sub, ast.Import) and any(a.name.split(".")[0] == "tr" for a in sub.names):
                found.append(f"line {sub.lineno}: import {', '.join(a.name for a in sub.names)}")
    return sorted(set(found), key=lambda s: int(s.split()[1].rstrip(":")))


def test_tr_imports_sit_at_the_top_of_the_file():
    bad, allowed_used = [], set()
    for path in tr_modules().values():
        rel = path.relative_to(ROOT).as_posix()
        lazy = function_level_imports(path)
        if lazy and rel in FUNCTION_LEVEL_IMPORTS:
            allowed_used.add(rel)
        elif lazy:
            bad += [f"{rel} {what}" for what in lazy]
    assert not bad, ("`tr` imports inside functions (move them to the top; a circle that appears "
                     "means code is in the wrong module):\n" + "\n".join(bad))
    assert allowed_used == set(FUNCTION_LEVEL_IMPORTS), "allowlisted files without lazy imports: " \
        f"{sorted(set(FUNCTION_LEVEL_IMPORTS) - allowed_used)}"


def test_the_function_level_import_finder_on_a_hand_made_module(tmp_path):
    source = tmp_path / "a.py"
    source.write_text("import os\nfrom tr.y import top\n\ndef f():\n    import json\n"
                      "    from tr.y import inner\n    class C:\n        def g(self):\n"
                      "            import tr.z\n            from . import b\n")
    assert function_level_imports(source) == [
        "line 6: from tr.y import inner", "line 9: import tr.z", "line 10: from . import b"]
