"""Static checks shared by the loaders: test discovery, test-script reading, shell syntax."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tr.envs.protected import PIP_INSTALL
from tr.envs.tasks import dockerfile as dfile, testscript
from tr.envs.tasks.model import Problem, VerifierSpec, script_interpreter, split_turns, test_functions
from tr.envs.verifier import JUNIT_FILENAME
from tr.envs.verifier import PENALTY_PREFIX

_INSTALLS = re.compile(
    r"\b(pip3?\s+install|uv\s+(pip|add|venv|sync|run)|uvx|curl|wget|apt(-get)?\s+install|conda)\b"
)
_PYTEST = re.compile(r"\bpytest\b")
_TEST_FILE_REF = re.compile(r"([\w./${}-]*?)(test_[\w-]+\.py|[\w-]+_test\.py)")


def find_test_files(tests_dir: Path) -> list[str]:
    """pytest's default collection over a tests dir: test_*.py and *_test.py, sorted, relative."""
    if not tests_dir.is_dir():
        return []
    found = {
        p.relative_to(tests_dir).as_posix()
        for pattern in ("test_*.py", "*_test.py")
        for p in tests_dir.rglob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    }
    return sorted(found)


def runs_pytest(script: str) -> bool:
    """Does a test script (run-tests.sh / test.sh) run pytest (ignoring comment lines)?"""
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    return bool(_PYTEST.search(code))


def runs_pytest_or_harness(script: str) -> bool:
    """pytest in the script itself, or TB1's harness file `run-uv-pytest.sh` (which runs it)."""
    return runs_pytest(script) or "run-uv-pytest.sh" in script


_OWN_INTERPRETER = re.compile(r"\bsys\.executable\b|^\s*(import pip\b|from pip\b)", re.M)


def own_interpreter_checks(tests_dir: Path, files) -> list[str]:
    """The test files that look at the interpreter running them (``sys.executable``, ``import
    pip``): under the protected verifier they see the project's Python."""
    found = []
    for rel in files:
        try:
            text = (tests_dir / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if _OWN_INTERPRETER.search(text):
            found.append(rel)
    return found


_LOCAL_SERVER = re.compile(r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0)(?::(\d{2,5}))?\b")


def local_server_checks(tests_dir: Path, files) -> dict[str, list[str]]:
    """The test files that talk to a server on the sandbox's own host (``localhost``,
    ``127.0.0.1``), with the ports they name: {file: ["localhost:8080", ...]}.  Under the
    protected verifier a server the *agent* left running is gone (every agent process ends
    before the tests), unlike Terminal-Bench's harness, which keeps them."""
    found: dict[str, list[str]] = {}
    for rel in files:
        try:
            text = (tests_dir / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        hits = [m.group(0) for m in _LOCAL_SERVER.finditer(text)]
        if hits:
            found[rel] = sorted(set(hits), key=hits.index)[:4]
    return found


def server_names(found: dict[str, list[str]]) -> tuple[str, ...]:
    """:func:`local_server_checks`' finding as ``VerifierSpec.servers``: "file (host:port, ...)"."""
    return tuple(f"{rel} ({', '.join(hosts)})" for rel, hosts in found.items())


# import name -> distribution name, where they differ (the common ones)
IMPORT_DISTS = {"sklearn": "scikit-learn", "cv2": "opencv-python", "PIL": "pillow",
                "yaml": "pyyaml", "bs4": "beautifulsoup4", "skimage": "scikit-image",
                "dateutil": "python-dateutil", "attr": "attrs", "Bio": "biopython",
                "Crypto": "pycryptodome", "jwt": "pyjwt", "dotenv": "python-dotenv",
                "docx": "python-docx", "magic": "python-magic", "serial": "pyserial",
                "zmq": "pyzmq", "git": "gitpython", "OpenSSL": "pyopenssl", "chess": "python-chess"}
_PIP_IN_RUN = re.compile(r"(?:^|\s)(?:python3?(?:\.\d+)?\s+-m\s+)?pip3?\s+install\s+(.*)$")


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_pip_requirements(dockerfile: Path) -> list[str]:
    """The requirements a Dockerfile's RUN lines `pip install` by name (flags, files, paths and
    variables left out), in order."""
    try:
        instructions = dfile.parse(dockerfile.read_text(encoding="utf-8"), dockerfile)
    except (OSError, UnicodeDecodeError, dfile.DockerfileError):
        return []
    found: list[str] = []
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        for part in re.split(r"&&|\|\||;|\|", ins.args):
            m = _PIP_IN_RUN.search(part.strip())
            if not m:
                continue
            words = m.group(1).split()
            skip = False
            for word in words:
                if skip:
                    skip = False
                    continue
                if word in ("-r", "-e", "-c", "--requirement", "--editable", "--constraint",
                            "-i", "--index-url", "--extra-index-url", "-f", "--find-links",
                            "--target", "-t", "--prefix", "--root"):
                    skip = True
                    continue
                word = word.strip("'\"")
                if word.startswith(("-", ".", "/", "$")) or "://" in word or not word:
                    continue
                if word not in found:
                    found.append(word)
    return found


def test_imports(tests_dir: Path, files) -> list[str]:
    """Top-level modules the test files import (anywhere in them), in order: not the standard
    library's, not a module of the tests folder."""
    import ast
    import sys
    names: list[str] = []
    local = {p.stem for p in tests_dir.rglob("*.py")} | {p.name for p in tests_dir.iterdir()
                                                          if p.is_dir()}
    for rel in files:
        try:
            tree = ast.parse((tests_dir / rel).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if (top not in names and top not in sys.stdlib_module_names
                        and top not in local):
                    names.append(top)
    return names


def image_package_installs(tests_dir: Path, files, dockerfile: Path | None) -> list[str]:
    """The Dockerfile's pip requirements whose modules the test files import and the project's
    interpreter (the verifier's) lacks: TB1 runs its tests with the sandbox's Python, which has
    them; the protected verifier installs the same pinned requirements for itself (from PyPI, a
    test-time install) instead of importing the sandbox's copies (the agent's to change)."""
    import importlib.util
    if dockerfile is None or not dockerfile.is_file():
        return []
    by_dist = {}
    for req in image_pip_requirements(dockerfile):
        by_dist.setdefault(_dist_key(re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0]), req)
    wanted: list[str] = []
    for module in test_imports(tests_dir, files):
        try:
            if importlib.util.find_spec(module) is not None:
                continue
        except (ImportError, ValueError):
            pass
        req = by_dist.get(_dist_key(IMPORT_DISTS.get(module, module)))
        if req is not None and req not in wanted:
            wanted.append(req)
    return wanted


def with_image_installs(spec: VerifierSpec, tests_dir: Path, dockerfile: Path | None
                        ) -> VerifierSpec:
    """``spec`` whose script first installs :func:`image_package_installs` for the verifier."""
    import dataclasses
    import shlex

    if spec.script_text is None:
        return spec
    wanted = image_package_installs(tests_dir, spec.test_files, dockerfile)
    if not wanted:
        return spec
    line = (f'{PIP_INSTALL} --target "$HOME/site" {" ".join(shlex.quote(r) for r in wanted)}'
            "  # tr: the tests import what the Dockerfile installs for the sandbox's Python")
    note = (f"the tests import {', '.join(wanted)}, which the Dockerfile installs for the "
            "sandbox's Python: installed for the verifier at test time (the same requirements, "
            "from PyPI; needs the network at test time)")
    return dataclasses.replace(spec, script_text=line + "\n" + spec.script_text,
                               note=f"{spec.note}; {note}" if spec.note else note)


def pytest_spec_from_script(script: str, script_name: str, tests_dir: Path) -> VerifierSpec:
    """The script run as written, pytest served by the project (tr.envs.tasks.testscript).

    test_files (for the static checks) are those the script names that exist in the tests dir,
    else every test file.
    """

    all_files = find_test_files(tests_dir)
    named = []
    harness = tests_dir / "run-uv-pytest.sh"
    harness_text = harness.read_text(encoding="utf-8", errors="replace") if harness.is_file() else None
    for text in (script, harness_text or testscript.DEFAULT_RUN):
        for match in _TEST_FILE_REF.finditer(text):
            base = match.group(2)
            for rel in all_files:
                if rel.rsplit("/", 1)[-1] == base and rel not in named:
                    named.append(rel)
    done = testscript.rewrite(script, junit=f"/logs/verifier/{JUNIT_FILENAME}",
                              run_uv_pytest=harness_text)
    installs = bool(_INSTALLS.search(script))
    why = "installs pytest over the network; " if installs else ""
    note = (f"{script_name} runs as written ({why}tr serves pytest from the project: "
            f"`$TR_PYTHON -m pytest`, offline)")
    if done.notes:
        note += "; " + "; ".join(done.notes)
    inspects = own_interpreter_checks(tests_dir, named or all_files)
    if inspects:
        note += (f"; {', '.join(inspects)} examine the Python that runs the tests "
                 "(sys.executable / pip): in the protected verifier that is the project's "
                 "interpreter, not the sandbox's (which is the agent's to fake), and its pip is "
                 "not importable there, so checks of the sandbox's pip fail for every attempt "
                 "(Terminal-Bench's harness runs them with the sandbox's own Python, unprotected)")
    servers = local_server_checks(tests_dir, named or all_files)
    return VerifierSpec(kind="pytest", test_files=tuple(named or all_files), note=note,
                        script_text=done.text, servers=server_names(servers))


def unserved_pytest_problem(spec: VerifierSpec, script_name: str) -> Problem | None:
    """A script that still runs a pytest the harness does not serve once rewritten (its own
    `pytest` would write the report, and the agent can replace it): refused, naming the line."""

    line = testscript.unserved_pytest(spec.script_text or "")
    if line is None:
        return None
    return Problem(script_name, None, f"runs a pytest the harness cannot serve: `{line[:160]}` "
                   "(tr runs its own pytest for the recognised forms -- pytest, python3.X -m "
                   "pytest, a path to pytest, behind timeout/env/xvfb-run/sudo/nice; the "
                   "sandbox's pytest is the agent's to replace)")


def shell_syntax_problems(text: str, file: str, label: str) -> list[Problem]:
    """`bash -n` on a script; unterminated heredocs count as errors."""
    try:
        proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Problem(file, None, f"{label}: cannot check shell syntax ({exc})")]
    err = proc.stderr.strip().replace("bash: ", "")
    if proc.returncode != 0:
        return [Problem(file, None, f"{label}: shell syntax error (bash -n): {err[:300]}")]
    if "here-document" in err:
        return [Problem(file, None, f"{label}: unterminated here-document ({err[:200]}); a heredoc "
                        "must not contain a blank line: blank lines separate turns")]
    return []


def solution_problems(path: Path, file: str, text: str, *, as_turns: bool,
                      syntax: bool = True) -> list[Problem]:
    """A solution script must hold commands and be runnable: every turn (or the whole) parses.

    `syntax=False` skips the `bash -n` runs (the cheap checks only)."""
    if as_turns:
        turns = split_turns(text)
        if not turns:
            return [Problem(file, None, "empty: no command outside comments")]
        problems = []
        interpreter = script_interpreter(text)
        if text.startswith("#!") and interpreter[-1].rsplit("/", 1)[-1] not in ("bash", "sh"):
            problems.append(Problem(file, None, f"shebang {' '.join(interpreter)!r}: turns run in "
                                    "bash; write the solution as shell commands"))
        for index, turn in enumerate(turns if syntax else (), start=1):
            first = turn.splitlines()[0][:60]
            problems += shell_syntax_problems(turn, file, f"turn {index} ({first!r})")
        return problems
    if not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        return [Problem(file, None, "empty: no command outside comments")]
    interpreter = script_interpreter(text)
    if syntax and interpreter[-1].rsplit("/", 1)[-1] in ("bash", "sh"):
        return shell_syntax_problems(text, file, "script")
    return []


def test_file_problems(tests_dir: Path, test_files: tuple[str, ...], rel_tests: str) -> tuple[
        list[Problem], set[str]]:
    """Parse every test file; return problems and the test names found (`f`, `Class::f`)."""
    problems, names = [], set()
    for rel in test_files:
        path = tests_dir / rel
        file = f"{rel_tests}/{rel}"
        try:
            found = test_functions(path)
        except SyntaxError as exc:
            problems.append(Problem(file, None, f"Python syntax error at line {exc.lineno}: {exc.msg}"))
            continue
        except UnicodeDecodeError:
            problems.append(Problem(file, None, "is not valid UTF-8 text"))
            continue
        except OSError as exc:
            problems.append(Problem(file, None, f"cannot be read: {exc.strerror}"))
            continue
        if not found:
            problems.append(Problem(file, None, "defines no test function (def test_...)"))
        names.update(found)
        names.update(n.split("::")[-1] for n in found)
    return problems, names


def gate_problems(spec: VerifierSpec, names: set[str]) -> list[Problem]:
    """final_gate / required must name existing scenario tests."""
    problems = []
    if spec.final_gate is not None:
        if spec.final_gate not in names:
            problems.append(Problem("task.toml", "verifier.final_gate",
                                    f"{spec.final_gate!r} is not a test function in tests/"))
        elif spec.final_gate.split("::")[-1].startswith(PENALTY_PREFIX):
            problems.append(Problem("task.toml", "verifier.final_gate",
                                    f"{spec.final_gate!r} is a penalty check, not a scenario check"))
    for name in spec.required or ():
        if name not in names:
            problems.append(Problem("task.toml", "verifier.required",
                                    f"{name!r} is not a test function in tests/"))
    return problems
