"""The protected verifier run: tests enter only after the agent is done, and the agent's leftovers
cannot change the verdict.

Order (the caller takes the pre-verifier snapshot first, e.g. ``Sandbox.snapshot()``):

1. ``end_session``: the agent's shell and every process it started are killed, so nothing of the
   agent runs while the tests do.
2. The tests are put at ``tests_mount`` (default ``/tests``), replacing whatever the agent left
   there: locally a read-only bind of the host folder that exists only in the verifier's own
   process tree; on Docker a fresh copy.  During the episode they exist nowhere in the sandbox.
3. ``results_dir`` (default ``/logs/verifier``) is deleted without following links and made
   empty, so a planted symlink or pre-written result file cannot stand in for the real one.
4. The command runs in a *fresh* shell (``run_fresh``: not the agent's shell, its own timeout)
   with a clean environment: fixed ``PATH``, no ``PYTHONPATH``/``PYTHONSTARTUP``, user site off,
   ``$TR_PYTHON`` the project's interpreter with pytest, mounted read-only at ``/opt/tr/python``
   with the project's site-packages as its site-packages (local: only in the verifier's tree,
   loader config from the pristine /etc; Docker: mounted at container creation).
   ``PYTEST_ADDOPTS=--confcutdir=<tests>`` keeps conftest.py files outside the tests unread.
   The command must start pytest as ``"$TR_PYTHON" -P -m pytest`` (``-P``: the cwd, where the
   agent may plant ``pytest.py``, is not on ``sys.path``).  The flag is not put in the
   environment (``PYTHONSAFEPATH``): every process the tests start would inherit it, and an
   agent's ``python3 script.py`` run by a test would lose its script folder from ``sys.path``.
5. The results folder is copied out to ``output_dir`` without following links (links skipped).

What this does not stop: code of the agent that the tests themselves import or run (its scripts,
and on Docker any system program it replaced) runs next to pytest with pytest's rights and can
do anything that process can, including rewriting the results file.  On Docker the agent is root
in its container, so it could also replace system libraries and ``/bin/bash`` that the verifier
uses (the interpreter and pytest themselves are read-only mounts); see
:mod:`tr.envs.docker_sandbox` for why this is left open and what would close it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tr.envs.sandbox import CommandResult, SandboxError

PYTHON_MOUNT = "/opt/tr/python"     # where the project interpreter appears (read-only)
VERIFIER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TESTS_MOUNT = "/tests"
RESULTS_DIR = "/logs/verifier"


def verifier_env(python: str, tests_mount: str) -> dict:
    """The whole environment of the verifier command (nothing inherited from the agent).
    ``LD_LIBRARY_PATH`` points at the mounted interpreter's own libpython (its RUNPATH names its
    host path, which does not exist inside)."""
    return {
        "LD_LIBRARY_PATH": f"{PYTHON_MOUNT}/lib",
        "PATH": VERIFIER_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TR_PYTHON": python,
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_ADDOPTS": f"--confcutdir={tests_mount} -p no:cacheprovider",
    }


def run_verifier(sandbox, tests_dir, command: str, *, timeout_s: float, output_dir,
                 tests_mount: str = TESTS_MOUNT, results_dir: str = RESULTS_DIR
                 ) -> CommandResult:
    """Run ``command`` as the protected verifier of ``sandbox`` (see module doc); results land in
    ``output_dir`` (created if missing).  Returns the command's result."""
    tests_dir = Path(tests_dir)
    if not tests_dir.is_dir():
        raise SandboxError(f"run_verifier: tests_dir {tests_dir} is not a folder")
    for name, value in (("tests_mount", tests_mount), ("results_dir", results_dir)):
        if not value.startswith("/") or value.rstrip("/") == "":
            raise ValueError(f"run_verifier: {name} must be an absolute path below /, "
                             f"got {value!r}")
    if not (timeout_s > 0):
        raise ValueError(f"run_verifier: timeout_s must be > 0, got {timeout_s!r}")
    sandbox.end_session()
    binds = list(sandbox.install_tests(tests_dir, tests_mount))
    sandbox.reset_dir(results_dir)
    python, python_binds = sandbox.verifier_python()
    result = sandbox.run_fresh(command, timeout_s=timeout_s,
                               extra_ro_binds=binds + list(python_binds),
                               env=verifier_env(python, tests_mount), clean_env=True)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        sandbox.copy_out(results_dir, output_dir, keep_symlinks=False)
    except SandboxError:
        pass   # the verifier removed or never made its results folder: nothing to copy
    return result


def python_mounts() -> tuple[str, list[tuple[str, str]]]:
    """(interpreter path inside, [(host path, sandbox path)] read-only binds) for the verifier."""
    root, exe, site = host_python()
    rel_exe = os.path.relpath(exe, root)
    version = os.path.basename(exe)
    binds = [(root, PYTHON_MOUNT), (site, f"{PYTHON_MOUNT}/lib/{version}/site-packages")]
    return f"{PYTHON_MOUNT}/{rel_exe}", binds


def host_python() -> tuple[str, str, str]:
    """(interpreter root, interpreter path, site-packages with pytest) of this project's env."""
    import sys
    import sysconfig
    root = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = os.path.join(root, "bin", version)
    if not os.path.exists(exe):
        exe = os.path.realpath(sys.executable)
    site = sysconfig.get_paths()["purelib"]
    import importlib.util
    if importlib.util.find_spec("pytest") is None:
        raise SandboxError("the project environment has no pytest; the verifier needs it")
    return root, exe, site

