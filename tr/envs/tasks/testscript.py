"""A task's own test script (TB1 `run-tests.sh`, Harbor `tests/test.sh`) run as written inside the
protected verifier, with only the lines that fetch and run pytest served by the project instead.

What changes (line by line, on the script's logical lines; everything else runs as written):

* lines that only install pytest or its runner -- `curl … astral.sh/uv … | sh`, `source
  $HOME/.local/bin/env`, `uv venv`/`uv init` and activating that venv, `apt-get install curl`,
  `pip install pytest…`/`uv add pytest…`, `source $TEST_DIR/setup-uv-pytest.sh` -- become `:`
  (a no-op keeps `if … fi` blocks well formed); `apt-get update` too when no kept line installs
  system packages;
* an install line that also names other Python packages keeps them: those the project's
  interpreter already has are dropped with a note; the rest are installed for the verifier's
  interpreter with `"$TR_PYTHON" -m pip install --target "$HOME/site"` (the project's pip, from
  `/opt/tr/pip`: it is not importable by the tests themselves; no pip configuration of the
  sandbox, the host's CAs: `tr.envs.protected.PIP_INSTALL`; needs the network at test
  time; the note says so);
* every pytest run -- `pytest`, `uv run pytest`, `python -m pytest`, `uvx … pytest`, and `bash
  $TEST_DIR/run-uv-pytest.sh` (TB1's harness file, inlined) -- becomes `"$TR_PYTHON" -P -m pytest
  --junitxml=<results>/junit.xml …` with plugin-only flags (`--ctrf`, `--json-report`) dropped.

The result is pure text (`rewrite`); the runner puts it into the protected command, where the
verifier's own shell reads it (no `bash` of the sandbox starts it).
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from dataclasses import dataclass

from tr.envs.protected import PIP_INSTALL

PYTEST_PACKAGES = re.compile(r"^(pytest([-_][\w-]+)?|pluggy|iniconfig|uv)([<>=!~\[ ].*)?$", re.I)
_TOOL_PACKAGES = {"curl", "wget", "ca-certificates", "python3-pip", "python3-venv", "python3-pytest",
                  "pipx"}
_UV_INSTALL = re.compile(r"(astral\.sh/uv|install\.python-poetry|pip3?\s+install\s+(-\S+\s+)*uv\s*$)")
_UV_ENV = re.compile(r"^\s*(source|\.)\s+\$\{?HOME\}?/\.(local|cargo)/bin/env\b")
_SETUP_SCRIPT = re.compile(r"^\s*(source|\.|bash|sh)\s+\S*setup-uv-pytest\.sh\b")
_RUN_SCRIPT = re.compile(r"^\s*(bash|sh|source|\.)\s+\S*run-uv-pytest\.sh\b(.*)$")
_UV_PROJECT = re.compile(r"^\s*uv\s+(init|add|sync|run)\b")
_UV_VENV = re.compile(r"^\s*uv\s+(venv|init)\b\s*(\S*)")
_ACTIVATE = re.compile(r"^\s*(source|\.)\s+(\S+)/bin/activate\s*$")
_APT = re.compile(r"^\s*(sudo\s+)?apt(-get)?\s+(-\S+\s+)*(install|update)\b(.*)$")
_PIP = re.compile(r"^\s*(sudo\s+)?((uv\s+pip|uv\s+add|python3?\s+-m\s+pip|pip3?)\s+(install\s+)?)(.*)$")
# Wrappers in front of a pytest run: dropped (`timeout`: the verifier has its own limit;
# `xvfb-run`, `sudo`, `nice`: programs of the sandbox, the agent's to replace) or, for
# environment assignments (`env A=B`, `A=B`), kept in front of the served run.
_WRAPPER = (r"(?:(?P<timeout>timeout\s+(?:(?:-s|--signal|-k|--kill-after)\s+\S+\s+|-\S+\s+)*"
            r"\d\S*\s+)"
            r"|(?P<xvfb>xvfb-run\s+(?:(?:-[a-z]\s+(?!-)\S+|-\S+)\s+)*)"
            r"|(?P<sudo>sudo\s+(?:-\S+\s+)*)|(?P<nice>nice\s+(?:-n\s*\S+\s+|-\d+\s+)?)"
            r"|(?P<env>env\s+(?:-\S+\s+)*)|(?P<assign>[A-Za-z_]\w*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+))")
_PYTEST_RUN = re.compile(
    r"(?P<pre>^\s*|[;&|(]\s*|\b(if|while|until|then|do|else|time|exec|!)\s+)"
    rf"(?P<wrap>{_WRAPPER.replace('?P<', '?:<').replace('(?:<timeout>', '(?:').replace('(?:<xvfb>', '(?:').replace('(?:<sudo>', '(?:').replace('(?:<nice>', '(?:').replace('(?:<env>', '(?:').replace('(?:<assign>', '(?:')}*)"
    r"(?P<cmd>(uv\s+run\s+(--\S+\s+)*)?(uvx\s+((-[pw]|--with|--from|--python)\s+\S+\s+|-\S+\s+)*|"
    r"(\S*/)?python3?(\.\d+)?\s+-m\s+)?"
    r"(\S*/)?pytest)(?=\s|$)(?P<args>[^;&|\n]*)")
_WRAPPER_RE = re.compile(_WRAPPER)
# `pytest` in command position that no rule above serves (after the served runs are replaced):
# such a task is refused at load (`unserved_pytest`)
_ANY_PYTEST = re.compile(r"(?:^|[\s;&|(`'\"])(?:[^\s'\"]*/)?pytest(?=$|[\s;&|)`'\"])")
_NOT_A_RUN = re.compile(r"\b(install|add|echo|printf|-p|--with|-w|no:\S*|which|command\s+-v|type)\s+$")
SERVED = "tr_pytest"
# The served pytest: a function of the verifier's shell (tr.envs.tasks.runner puts it in front of
# the script).  It runs the harness's pytest without fd 9 -- the verifier's own output, which
# the harness reads -- and then writes the run's exit status there
# (tr.envs.verifier.EXIT_MARK): a run that is killed cannot hide how it ended.
SERVED_FUNCTION = (f'exec 9>&1; {SERVED}() {{ "$TR_PYTHON" -P -m pytest "$@" 9>&-; set -- "$?"; '
                   f"printf '\\n%s %s\\n' '[tr-pytest-exit]' \"$1\" >&9; return \"$1\"; }}\n")
_PLUGIN_FLAGS = re.compile(r"\s--(ctrf|json-report-file|json-report|html|cov(-report)?)(=\S+|\s+(?!-)\S+)?")
DEFAULT_RUN = "pytest $TEST_DIR/test_outputs.py -rA"


@dataclass(frozen=True)
class Rewritten:
    text: str                 # the script to run (bash syntax)
    notes: tuple[str, ...]    # what changed and why, one line each
    runs_pytest: bool         # at least one pytest run is in it


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined (heredoc bodies are kept line by line)."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _have(requirement: str) -> bool:
    """Is a pip requirement's distribution installed in the project env (any version)?"""
    name = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def pytest_command(args: str, junit: str) -> str:
    tail = args[len(args.rstrip()):]
    args = _PLUGIN_FLAGS.sub("", " " + args).strip()
    return (f"{SERVED} -p no:cacheprovider -o junit_family=xunit1 "
            f"--junitxml={junit} {args}").rstrip() + tail


def _serve_pytest(line: str, junit: str, notes: list[str]) -> tuple[str, bool]:
    hit = [False]

    def repl(m: re.Match) -> str:
        hit[0] = True
        kept = []
        for w in _WRAPPER_RE.finditer(m.group("wrap")):
            if w.group("assign"):
                kept.append(w.group("assign"))
            elif not w.group("env"):
                word = w.group(0).split()[0]
                note = (f"`{word}` in front of pytest is dropped (the verifier has its own time "
                        "limit)" if word == "timeout" else
                        f"`{word}` in front of pytest is dropped (a program of the sandbox: the "
                        "harness's pytest runs without it)")
                if note not in notes:
                    notes.append(note)
        return m.group("pre") + "".join(kept) + pytest_command(m.group("args"), junit)

    return _PYTEST_RUN.sub(repl, line), hit[0]


def unserved_pytest(text: str) -> str | None:
    """The first line of a rewritten script that still runs a pytest of the sandbox (one no
    rule serves: the agent's to replace), else None.  Comments, quoted strings and package
    arguments (`pip install pytest`) do not count."""
    heredoc = None
    for line in _logical_lines(text):
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        doc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if doc and not line.strip().startswith("#"):
            heredoc = doc.group(1)
        code = line
        if not re.search(r"\b(ba|da|z)?sh\s+(-\S+\s+)*-c\b|\beval\b", line):  # else quoted code runs
            code = re.sub(r"'[^']*'|\"(?:[^\"\\\\]|\\\\.)*\"", "''", line)
        code = re.sub(r"(^|\s)#.*$", "", code)
        for m in _ANY_PYTEST.finditer(code):
            if not _NOT_A_RUN.search(code[:m.start() + 1]):
                return line.strip()
    return None


def rewrite(script: str, *, junit: str, run_uv_pytest: str | None = None,
            _top: bool = True) -> Rewritten:
    """The script with pytest served by the project (see module doc).  `run_uv_pytest`: the text
    of the task's `tests/run-uv-pytest.sh` when it ships one (else TB1's default run)."""
    notes: list[str] = []
    venvs: set[str] = set()
    lines = _logical_lines(script)
    system_installs = False
    heredoc: str | None = None
    for line in lines:
        m = _APT.match(line)
        if m and m.group(4) == "install":
            pkgs = [w for w in m.group(5).split() if not w.startswith("-") and w not in ("&&", ";")]
            if any(p not in _TOOL_PACKAGES for p in pkgs):
                system_installs = True
    out: list[str] = []
    ran = False
    for line in lines:
        if heredoc is not None:
            out.append(line)
            if line.strip() == heredoc:
                heredoc = None
            continue
        stripped = line.strip()
        doc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if doc and not stripped.startswith("#"):
            heredoc = doc.group(1)
        if not stripped or stripped.startswith("#"):
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        if _SETUP_SCRIPT.match(line) or _UV_ENV.match(line) or _UV_INSTALL.search(line):
            out.append(f"{indent}:  # tr: pytest is the project's: {stripped[:100]}")
            continue
        m = _UV_VENV.match(line)
        if m:
            venvs.add(m.group(2) or ".venv")
            out.append(f"{indent}:  # tr: pytest is the project's: {stripped[:100]}")
            continue
        m = _ACTIVATE.match(line)
        if m and (m.group(2) in venvs or m.group(2).rstrip("/").split("/")[-1] in venvs):
            out.append(f"{indent}:  # tr: pytest is the project's: {stripped[:100]}")
            continue
        m = _APT.match(line)
        if m and "&&" not in line and ";" not in line:
            pkgs = [w for w in m.group(5).split() if not w.startswith("-")]
            if (m.group(4) == "update" and not system_installs) or (
                    m.group(4) == "install" and all(p in _TOOL_PACKAGES for p in pkgs)):
                out.append(f"{indent}:  # tr: only fetched pytest's runner: {stripped[:100]}")
                continue
        m = _PIP.match(line)
        if m and "&&" not in line and ";" not in line and "|" not in line:
            words = m.group(5).split()
            reqs = [w for w in words if not w.startswith("-")]
            flags = [w for w in words if w.startswith("-")]
            if reqs and not any(f in ("-r", "-e", "--requirement", "--editable") for f in flags) \
                    and not any(r.startswith((".", "/", "$")) for r in reqs):
                rest = [r for r in reqs if not PYTEST_PACKAGES.match(r)]
                missing = [r for r in rest if not _have(r)]
                have = [r for r in rest if r not in missing]
                if have:
                    notes.append(f"test-time install of {', '.join(have)}: the project's "
                                 "interpreter has them")
                if missing:
                    notes.append(f"test-time install of {', '.join(missing)} (not in the project "
                                 "env): installed for the verifier, needs the network at test time")
                    out.append(f'{indent}{PIP_INSTALL} '
                               f'--target "$HOME/site" {" ".join(shlex.quote(r) for r in missing)}'
                               f'  # tr: was: {stripped[:100]}')
                else:
                    out.append(f"{indent}:  # tr: pytest is the project's: {stripped[:100]}")
                continue
        m = _RUN_SCRIPT.match(line)
        if m:
            body = run_uv_pytest if run_uv_pytest is not None else DEFAULT_RUN
            inner = rewrite(body, junit=junit, _top=False)
            out.append(f"{indent}# tr: {stripped[:100]} (inlined)")
            out.extend(indent + ln for ln in inner.text.splitlines() if ln.strip()
                       and not ln.startswith("#!"))
            ran = ran or inner.runs_pytest
            continue
        new, hit = _serve_pytest(line, junit, notes)
        ran = ran or hit
        out.append(new)
    head = 'export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$HOME/site"\n' if _top else ""
    if _top and any(_SETUP_SCRIPT.match(ln) or _UV_PROJECT.match(ln) for ln in lines):
        # TB1's harness (`uv init; uv add pytest` in the workdir) installs a project folder's
        # own package into its test env: the tests may import it (TR_PROJECT_DIR, see
        # tr.envs.protected's sitecustomize: served to imports of test files only)
        head += ('if [ -f pyproject.toml ] || [ -f setup.py ]; then export TR_PROJECT_DIR="$PWD"; '
                 'fi  # tr: the workdir is a Python project\n')
    text = head + "\n".join(out) + "\n"
    return Rewritten(text=text, notes=tuple(notes), runs_pytest=ran)
