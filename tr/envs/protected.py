"""The protected verifier run: tests enter only after the agent is done, and nothing the agent
wrote can change what the verifier itself runs or reads.

Order (the caller takes the pre-verifier snapshot first, e.g. ``Sandbox.snapshot()``):

1. ``end_session``: the agent's shell and *every* process the agent started are killed --
   whatever it did with traps, ``setsid``, double forks or cgroups (locally the sandbox's whole
   cgroup tree and PID namespace, on Docker every process of the container but its PID 1) -- and
   the backend checks that none is left, so nothing of the agent runs while the tests do.
2. The tests are put at ``tests_mount`` (default ``/tests``), replacing whatever the agent left
   there: locally a read-only bind of the host folder that exists only in the verifier's own
   process tree; on Docker a fresh copy written from the host.  During the episode they exist
   nowhere in the sandbox.
3. ``results_dir`` (default ``/logs/verifier``) and the verifier's home are deleted without
   following links and made empty, so a planted symlink or pre-written result file cannot stand in
   for the real one.  No harness step runs a program of the sandbox for this: deletes and copies
   are host-side ``openat(O_NOFOLLOW)`` walks (Docker: through ``/proc/<pid 1>/root``).
4. The command runs in a *fresh* shell (``run_fresh``: not the agent's shell, its own timeout)
   with a clean environment whose every configuration hook points at harness-owned files, written
   by the host and mounted read-only at ``/opt/tr/verifier`` (:func:`verifier_files`):

   * pytest is told its configuration file and root (``-c /opt/tr/verifier/pytest.ini
     --rootdir=<tests> --confcutdir=<tests>`` in ``PYTEST_ADDOPTS``), so no ``pytest.ini``,
     ``.pytest.ini``, ``pytest.toml``, ``pyproject.toml``, ``tox.ini``, ``setup.cfg`` or
     ``conftest.py`` the agent planted is read; plugin autoload is off;
   * Python: ``PYTHONPATH`` starts with a folder whose empty ``sitecustomize``/``usercustomize``
     shadow any the agent planted (Debian's Python imports ``/etc/python3.X/sitecustomize.py``),
     user site off, no ``PYTHONSTARTUP``; pytest runs as ``"$TR_PYTHON" -P -m pytest`` (``-P``:
     the cwd, where the agent may plant ``pytest.py``, is not on ``sys.path``);
   * ``OPENSSL_CONF`` (an ``/etc/ssl/openssl.cnf`` can load any shared library into every process
     using OpenSSL, pytest's ``hashlib`` included), ``GIT_CONFIG_SYSTEM`` and ``HOME`` (a fresh
     empty folder) are the harness's;
   * names: the verifier's tree reads the harness's ``nsswitch.conf`` (``files``/``dns`` only:
     glibc loads ``libnss_<service>.so.2`` for every service the file names, and a name may
     hold a ``/``), so users, groups and hosts come from ``/etc``'s files as data and no library
     of the agent's loads; ``SHELL``, ``HOME``, ``USER`` are set (bash looks its user up
     otherwise).  Locally the other indirections the host's programs follow through ``/etc``
     -- ``alternatives`` (``awk``, ``editor`` ... are links through it), PAM's configuration,
     the loader's -- are the pristine copy's (:data:`tr.envs.local.PRISTINE_ETC`);
   * git: ``GIT_CONFIG_COUNT`` settings, which win over every configuration file, turn off
     ``core.fsmonitor`` and repository hooks (``core.hooksPath=/dev/null``) for any git a test
     runs, and ``GIT_CONFIG_NOSYSTEM``;
   * pytest imports the tests in ``importlib`` mode: no folder is put on ``sys.path`` for them
     (prepend mode put a package's root -- ``/`` for ``/tests/__init__.py`` -- first, where the
     agent may write ``statistics.py``); ``/tests`` and a harness-owned parent of it
     (``pkgroot/tests``) are on ``PYTHONPATH`` instead;
   * the harness's plugin ``tr_collected`` records what pytest collected (``collected.json``
     and a digest line on the verifier's output), and :mod:`tr.envs.verifier` accepts a report
     only as the runner's own word: exit status 0 or 1, consistent with the report, every
     collected test in it and nothing else (a TB1 script's served pytest writes its exit status
     on a descriptor its tests do not inherit: :data:`tr.envs.tasks.testscript.SERVED_FUNCTION`);
   * ``$TR_PYTHON`` is the project's interpreter with pytest, read-only at ``/opt/tr/python``
     with the project's site-packages; locally the loader configuration (``ld.so.*``) comes from
     the pristine ``/etc`` copy and ``/etc/ld.so.preload`` is deleted.  On Docker the verifier's
     shell and interpreter are started by the host's own loader and libraries, mounted read-only
     (:meth:`tr.envs.docker_sandbox.DockerSandbox.verifier_python`), so neither the container's
     ``/bin/bash`` nor its ``libc`` -- both writable by the agent there -- is in the verifier.
   The flag is not put in the environment (``PYTHONSAFEPATH``): every process the tests start
   would inherit it, and an agent's ``python3 script.py`` run by a test would lose its script
   folder from ``sys.path``.
5. The results folder is copied out to ``output_dir`` without following links (links skipped);
   the caller reads its result file from exactly one path there.

Beside the agent (``beside_agent=True``; tests that talk to a server the agent left running, as
Terminal-Bench's and Harbor's harnesses keep agent processes alive while tests run): steps 1-5
run in ``sandbox.network_sibling()`` instead -- on Docker a new container started from a
snapshot of the agent's files taken at that moment, which joins ONLY the agent container's
network namespace.  The agent's processes keep running in their own container, so its servers
answer the tests on ``localhost``; they cannot see or touch the sibling's files (its root
filesystem and writable areas are copies, the tests and results exist only there), processes
(another PID namespace and cgroup) or mounts, and files they change after the snapshot are not
what the tests read (Docker's shared ``/etc/hosts``/``resolv.conf``/``hostname`` are replaced by
read-only copies).  What they share is the network: the tests' requests reach the agent's
servers (the point), and a server the agent left can equally read, delay or answer whatever the
tests send to localhost ports or abstract unix sockets -- the exposure of testing a live server.
A server that writes files the tests then read (a log of the tests' own requests) writes them in
the agent's container, not the sibling: those tests see the files as they were at the snapshot.
``end_session`` still runs, in the sibling (none of the agent's processes are there).

What this does not stop: code of the agent that the tests themselves import or run (its scripts,
and on Docker any system program it replaced that a test calls) runs next to pytest with the
verifier's rights and can do anything that process can -- the exposure Terminal-Bench's own
harness has.  Rewriting the results file and killing the runner no longer passes (the verdict
needs the runner's exit status and collected cases), but code *inside* the pytest process (a
module the tests import from the agent's folders) can still end it with status 0 after writing
a consistent report, and on Docker a test's ``python3``/``git``/``awk`` are the agent's programs.  Task verifiers that are shell scripts
(``reward_file`` kind: ``bash /tests/run-tests.sh``) run the sandbox's own ``bash`` and tools by
design.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tr.envs.sandbox import CommandResult, SandboxError
from tr.envs.workspace import private_dir

PYTHON_MOUNT = "/opt/tr/python"     # where the project interpreter appears (read-only)
PIP_MOUNT = "/opt/tr/pip"           # the project's pip, off the verifier's sys.path (read-only)
FILES_MOUNT = "/opt/tr/verifier"    # harness-owned configuration files (read-only)
VERIFIER_HOME = "/tmp/.tr-verifier-home"
# last: `python` -> /usr/bin/python3 where the sandbox has no `python` (python images have one)
VERIFIER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/tr/verifier/bin"
TESTS_MOUNT = "/tests"
RESULTS_DIR = "/logs/verifier"
COLLECTED_FILENAME = "collected.json"   # the node ids the harness's pytest collected
CHECKRUN = f"{FILES_MOUNT}/checkrun.py"   # the stdlib check runner (tr/envs/checkrun.py)
LINKS = {"bin/python": "/usr/bin/python3",     # harness-owned links in FILES_MOUNT
         # `import tests.x` in a package of tests: /tests through a harness-owned parent
         # (pytest imports in importlib mode, so no agent-writable folder is on sys.path)
         "pkgroot/tests": TESTS_MOUNT}
NSS_DATABASES = ("passwd", "group", "shadow", "gshadow", "hosts", "networks", "protocols",
                 "services", "ethers", "rpc", "netgroup", "aliases", "initgroups")
# What the verifier's git never runs from a repository's or the sandbox's configuration: command
# line settings (GIT_CONFIG_COUNT) win over every configuration file.
GIT_OVERRIDES = (("core.fsmonitor", "false"), ("core.hooksPath", "/dev/null"),
                 ("core.pager", "cat"))
COLLECTED_MARK = "[tr-collected]"
# The harness's pytest plugin: at the end of collection it writes the node ids it collected
# (rootdir-relative) to $TR_COLLECTED (a results file) and prints their count and digest on the
# verifier's own output, so the harness can tell a report that lost or gained cases
# (tr.envs.verifier.check_runner_word).
COLLECTED_PLUGIN = f"""# tr's protected verifier: which tests pytest collected (tr.envs.protected).
import hashlib
import json
import os

_line = None


def pytest_collection_finish(session):
    global _line
    ids = sorted(item.nodeid for item in session.items)
    text = json.dumps(ids)
    path = os.environ.get("TR_COLLECTED")
    if path:
        with open(path, "w") as f:
            f.write(text)
    _line = "{COLLECTED_MARK} %d %s" % (len(ids), hashlib.sha256(text.encode()).hexdigest())
    _say(session.config)


def pytest_unconfigure(config):
    _say(config)


def _say(config):
    if _line is None:
        return
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(_line)
    else:
        os.write(1, (_line + "\\n").encode())
"""
# TB1's harness installs a project folder's own package into its test env (`uv init; uv add`
# in the workdir).  When the verifier's script says so (TR_PROJECT_DIR, set by
# tr.envs.tasks.testscript), a top-level module found nowhere else is looked up there -- but only
# for an import written in a test file (under $TEST_DIR): the tests mean to run that code (the
# exposure of tests importing the agent's code); pytest's own imports never reach the folder.
PROJECT_FINDER = """
import os as _os
import sys as _sys


def _tr_project_finder():
    root, tests = _os.environ.get("TR_PROJECT_DIR"), _os.environ.get("TEST_DIR", "/tests")
    if not root:
        return
    from importlib.machinery import PathFinder

    class ProjectFinder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if path is not None or "." in name:
                return None
            frame = _sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(("<frozen", "<")):
                frame = frame.f_back
            if frame is None or not frame.f_code.co_filename.startswith(tests.rstrip("/") + "/"):
                return None
            return PathFinder.find_spec(name, [root])

    _sys.meta_path.append(ProjectFinder)


_tr_project_finder()
del _tr_project_finder
"""



def _host_ca_bundle() -> str:
    """The certificate authorities this host's own pip trusts (``$PIP_CERT``, ``$SSL_CERT_FILE``,
    OpenSSL's default file; else pip's certifi): the verifier's test-time installs trust these,
    never the sandbox's (whose ``/etc/ssl`` is the agent's to extend)."""
    import ssl
    paths = ssl.get_default_verify_paths()
    for path in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), paths.cafile,
                 paths.openssl_cafile):
        if path and os.path.isfile(path):
            try:
                return Path(path).read_text(encoding="ascii", errors="ignore")
            except OSError:
                continue
    try:
        from pip._vendor import certifi
        return Path(certifi.where()).read_text(encoding="ascii", errors="ignore")
    except (ImportError, OSError):
        return ""


CA_BUNDLE = f"{FILES_MOUNT}/ca-certificates.crt"
# A test-time `pip install` in the verifier: the harness's pip (off the tests' sys.path), no
# configuration file or PIP_* variable of the sandbox (an agent's /etc/pip.conf could point it at
# its own index or wheels: code of the agent in the verifier), the host's CAs only (truststore
# would read the sandbox's /etc/ssl; with a live agent server beside the tests -- beside_agent --
# and /etc/hosts naming it for the index, that would be a forged index).
PIP_INSTALL = (f'PIP_CONFIG_FILE=/dev/null PYTHONPATH="{PIP_MOUNT}:$PYTHONPATH" "$TR_PYTHON" -P '
               f'-m pip install --isolated -q --disable-pip-version-check '
               f'--use-deprecated=legacy-certs --cert {CA_BUNDLE}')

# The harness-owned files mounted at FILES_MOUNT (see the module doc).
FILES = {
    "checkrun.py": (Path(__file__).resolve().parent / "checkrun.py").read_text(),
    "pytest.ini": "# The protected verifier's pytest configuration (tr.envs.protected): pytest reads\n"
                  "# this file and no configuration file of the sandbox.\n[pytest]\n",
    "openssl.cnf": "# The protected verifier's OpenSSL configuration: the built-in defaults,\n"
                   "# no providers or engines loaded from files.\n",
    "gitconfig": "# The protected verifier's system-wide git configuration: empty.\n",
    "site/sitecustomize.py": "# Shadows any sitecustomize module of the sandbox in the verifier's "
                             "processes.\n" + PROJECT_FINDER,
    "site/usercustomize.py": "# Shadows any usercustomize module of the sandbox in the verifier's "
                             "processes.\n",
    "no-pip/__init__.py": "# Mounted over the project's pip in the protected verifier's Python "
                          "(tr.envs.protected).\nraise ImportError(\"pip is not importable in tr's "
                          "protected verifier: a test that imports it or runs `sys.executable -m "
                          "pip` would judge the harness's Python, not the sandbox's\")\n",
    "ca-certificates.crt": _host_ca_bundle(),
    # glibc loads ``libnss_<service>.so.2`` for every service /etc/nsswitch.conf names (a name
    # may hold a ``/``: any library of the agent's, relative to the cwd); the verifier's tree
    # reads this one instead, built-in services only (``files``, ``dns``: in libc since 2.34)
    "nsswitch.conf": "# The protected verifier's name service switch: users, groups and hosts come\n"
                     "# from the files of /etc (data), no module is loaded.\n"
                     + "".join(f"{db}: {'files dns' if db == 'hosts' else 'files'}\n"
                               for db in NSS_DATABASES),
    "site/tr_collected.py": COLLECTED_PLUGIN,
}
# Part of the folder name, so a changed file is never served from an older copy.
FILES_VERSION = hashlib.sha256(repr((sorted(FILES.items()), sorted(LINKS.items()))).encode()
                               ).hexdigest()[:12]


def verifier_files(state_dir) -> Path:
    """The host folder of :data:`FILES` (written once per state folder, atomically; the folder
    0755 and the files 0644, read-only to the sandbox through its mount)."""
    state_dir = private_dir(Path(state_dir))
    dest = state_dir / f"verifier-files-{FILES_VERSION}"
    if dest.is_dir():
        return dest
    tmp = state_dir / f".verifier-files.{os.getpid()}.{os.urandom(4).hex()}"
    for rel, text in FILES.items():
        path = tmp / rel
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    for rel, target in LINKS.items():
        (tmp / rel).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.symlink(target, tmp / rel)
    for d in [tmp, *{(tmp / rel).parent for rel in [*FILES, *LINKS]}]:
        d.chmod(0o755)
    try:
        os.rename(tmp, dest)
    except OSError:                        # another process won the race
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def verifier_env(python: str, tests_mount: str) -> dict:
    """The whole environment of the verifier command (nothing inherited from the agent; every
    configuration hook at a harness-owned file).  ``LD_LIBRARY_PATH`` points at the mounted
    interpreter's own libpython (its RUNPATH names its host path, which does not exist inside)."""
    return {
        "LD_LIBRARY_PATH": f"{PYTHON_MOUNT}/lib",
        "PATH": VERIFIER_PATH,
        "HOME": VERIFIER_HOME,
        "USER": "root",          # getpass.getuser() (pytest's tmp_path) then needs no NSS lookup
        "LOGNAME": "root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TR_PYTHON": python,
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENSSL_CONF": f"{FILES_MOUNT}/openssl.cnf",
        "GIT_CONFIG_SYSTEM": f"{FILES_MOUNT}/gitconfig",
        "GIT_CONFIG_NOSYSTEM": "1",
        **git_overrides(),
        "SHELL": "/bin/bash",    # bash looks its user up when SHELL is unset
        "TR_COLLECTED": f"{RESULTS_DIR}/{COLLECTED_FILENAME}",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        # importlib mode: pytest puts no folder on sys.path for the tests (prepend mode would put
        # the tests' package root, `/` for a /tests/__init__.py, first); the tests' own folder
        # and a harness-owned parent of it are on PYTHONPATH instead, so `import helpers`,
        # `import tests.helpers` and relative imports keep working
        "PYTHONPATH": (f"{FILES_MOUNT}/site:{tests_mount}"
                       + (f":{FILES_MOUNT}/pkgroot" if tests_mount == TESTS_MOUNT else "")),
        "PYTEST_ADDOPTS": (f"-c {FILES_MOUNT}/pytest.ini --rootdir={tests_mount} "
                           f"--confcutdir={tests_mount} -p no:cacheprovider "
                           f"--import-mode=importlib -p tr_collected"),
    }


def git_overrides() -> dict:
    """``GIT_CONFIG_COUNT``/``KEY_n``/``VALUE_n`` for :data:`GIT_OVERRIDES`."""
    env = {"GIT_CONFIG_COUNT": str(len(GIT_OVERRIDES))}
    for i, (key, value) in enumerate(GIT_OVERRIDES):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def run_verifier(sandbox, tests_dir, command: str, *, timeout_s: float, output_dir,
                 tests_mount: str = TESTS_MOUNT, results_dir: str = RESULTS_DIR,
                 beside_agent: bool = False) -> CommandResult:
    """Run ``command`` as the protected verifier of ``sandbox`` (see module doc); results land in
    ``output_dir`` (created if missing).  Returns the command's result.  ``beside_agent``: the
    steps run in ``sandbox.network_sibling()`` (closed after), so the agent's processes -- its
    servers -- keep running and answer on localhost; SandboxError where the backend cannot."""
    tests_dir = Path(tests_dir)
    if not tests_dir.is_dir():
        raise SandboxError(f"run_verifier: tests_dir {tests_dir} is not a folder")
    for name, value in (("tests_mount", tests_mount), ("results_dir", results_dir)):
        if not value.startswith("/") or value.rstrip("/") == "":
            raise ValueError(f"run_verifier: {name} must be an absolute path below /, "
                             f"got {value!r}")
    if not (timeout_s > 0):
        raise ValueError(f"run_verifier: timeout_s must be > 0, got {timeout_s!r}")
    if beside_agent:
        sibling = sandbox.network_sibling()
        try:
            return _run(sibling, tests_dir, command, timeout_s, Path(output_dir), tests_mount,
                        results_dir)
        finally:
            sibling.close()
    return _run(sandbox, tests_dir, command, timeout_s, Path(output_dir), tests_mount, results_dir)


def _run(sandbox, tests_dir: Path, command: str, timeout_s: float, output_dir: Path,
         tests_mount: str, results_dir: str) -> CommandResult:
    """Steps 1-5 of the module doc in ``sandbox``."""
    sandbox.end_session()
    binds = list(sandbox.install_tests(tests_dir, tests_mount))
    sandbox.reset_dir(results_dir)
    sandbox.reset_dir(VERIFIER_HOME)
    python, python_binds = sandbox.verifier_python()
    result = sandbox.run_fresh(command, timeout_s=timeout_s,
                               extra_ro_binds=binds + list(python_binds),
                               env=verifier_env(python, tests_mount), clean_env=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        sandbox.copy_out(results_dir, output_dir, keep_symlinks=False)
    except SandboxError:
        pass   # the verifier removed or never made its results folder: nothing to copy
    return result


def python_mounts(state_dir) -> tuple[str, list[tuple[str, str]]]:
    """(interpreter path inside, [(host path, sandbox path)] read-only binds) for the verifier:
    the interpreter, its site-packages and the harness-owned files."""
    root, exe, site = host_python()
    rel_exe = os.path.relpath(exe, root)
    version = os.path.basename(exe)
    files = verifier_files(state_dir)
    site_mount = f"{PYTHON_MOUNT}/lib/{version}/site-packages"
    binds = [(root, PYTHON_MOUNT), (site, site_mount), (str(files), FILES_MOUNT)]
    pip = os.path.join(site, "pip")
    if os.path.isdir(pip):       # after site-packages: bwrap stacks binds in order, Docker by depth
        binds += [(pip, f"{PIP_MOUNT}/pip"), (str(files / "no-pip"), f"{site_mount}/pip")]
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

