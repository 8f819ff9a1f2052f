"""The Sandbox protocol is the truth: every backend has its methods with compatible signatures and
behaves as the protocol says (real bubblewrap, real Docker engine); a new backend is one file; and
``tr.envs.sandbox`` imports no backend (no import circle)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tr.envs import backends
from tr.envs.backends import Backend, discard_snapshot, get_backend, make_sandbox
from tr.envs.sandbox import PROTOCOL_METHODS, Sandbox, SandboxConfig, SandboxError

from test_sandbox import backend, docker_problem  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(memory_mb=512, pids=128, disk_mb=64, file_size_mb=64, cpu_time_s=60)


def _imported_after(statement: str) -> list[str]:
    code = (f"import sys\n{statement}\n"
            "print(__import__('json').dumps(sorted(m for m in sys.modules if m.startswith('tr.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_importing_the_protocol_imports_no_backend():
    loaded = _imported_after("import tr.envs.sandbox")
    assert loaded == ["tr.envs", "tr.envs.sandbox"], loaded
    loaded = _imported_after("import tr.envs.backends")
    assert not {"tr.envs.local", "tr.envs.docker_sandbox"} & set(loaded), loaded


@pytest.mark.parametrize("name", backends.BACKENDS)
def test_every_backend_class_has_the_protocol_with_compatible_signatures(name):
    cls = get_backend(name).sandbox_class()
    for method in PROTOCOL_METHODS:
        assert hasattr(cls, method), f"{cls.__name__} lacks {method}"
        want = inspect.signature(getattr(Sandbox, method))
        have = inspect.signature(getattr(cls, method))
        for param in want.parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name == "self":
                continue
            assert param.name in have.parameters or any(
                p.kind == p.VAR_KEYWORD for p in have.parameters.values()), \
                f"{cls.__name__}.{method} has no parameter {param.name!r}"
            got = have.parameters.get(param.name)
            if got is not None and param.default is not param.empty:
                assert got.default == param.default, \
                    f"{cls.__name__}.{method}({param.name}=) default {got.default!r} != {param.default!r}"
        extra = [p for p in have.parameters.values() if p.name not in want.parameters
                 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                 and p.default is p.empty]
        assert not extra, f"{cls.__name__}.{method} requires {[p.name for p in extra]}"
    assert get_backend(name).name == name and cls.backend == name


def test_unknown_backends_are_named_in_the_error():
    with pytest.raises(ValueError, match="unknown backend 'lokal'"):
        make_sandbox("lokal")
    with pytest.raises(ValueError, match="defines no BACKEND"):
        get_backend("tr.envs.sandbox")
    with pytest.raises(TypeError, match="SandboxConfig"):
        make_sandbox("local", {"workdir": "/app"})


def test_a_backend_behaves_as_the_protocol_says(backend, tmp_path):  # noqa: F811
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        assert isinstance(box, Sandbox) and box.alive() and box.backend == backend
        assert box.run("cd /tmp && X=1 && echo ok").output.strip() == "ok"
        assert box.run("pwd; echo $X").output.split() == ["/tmp", "1"]       # persistent shell
        fresh = box.run_fresh("pwd; echo ${X:-unset} $Y", env={"Y": "y"}, clean_env=True)
        assert fresh.ok and fresh.output.split()[-2:] == ["unset", "y"]      # not the agent's shell
        box.write_file("/app/d/f.txt", "one", mode=0o600)
        assert box.read_file("/app/d/f.txt") == b"one"
        box.run("ln -s /etc/passwd /app/d/link")
        skipped = box.copy_out("/app/d", tmp_path / "out", keep_symlinks=False)
        assert isinstance(skipped, list) and any(s.endswith("link") for s in skipped)
        assert (tmp_path / "out" / "f.txt").read_text() == "one"
        assert not (tmp_path / "out" / "link").exists()
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "g.txt").write_text("two")
        box.copy_in(tmp_path / "in", "/app/in")
        assert box.run("cat /app/in/g.txt").output == "two"
        snap = box.snapshot(persist=False)      # dies with the sandbox
        assert snap.backend == backend and json.loads(json.dumps(snap.__dict__))
        box.remove_path("/app/d")
        box.remove_path("/app/never-there")                            # missing: fine
        assert box.run("test -e /app/d; echo $?").output.strip() == "1"
        box.run("sleep 300 &")
        box.restore(snap)                                              # ends the session
        assert box.read_file("/app/d/f.txt") == b"one"
        assert box.run("jobs | wc -l").output.strip() == "0"
        with box.fork(snap) as child:
            assert child.alive() and child.read_file("/app/in/g.txt") == b"two"
            child.write_file("/app/in/g.txt", "changed")
        assert box.read_file("/app/in/g.txt") == b"two"                # forks are apart
        other = "docker" if backend == "local" else "local"
        with pytest.raises(SandboxError, match=f"cannot restore a '{other}' snapshot"):
            box.restore(snap.__class__(id="x", backend=other, location=str(tmp_path)))
        box.reset_dir("/logs/verifier")
        assert box.run("ls -A /logs/verifier | wc -l").output.strip() == "0"
        python, binds = box.verifier_python()
        assert isinstance(python, str) and isinstance(binds, list)
        box.run("sleep 300 & disown")
        box.end_session()
        assert box.run("echo again").output.strip() == "again"             # a new shell
        if get_backend(backend).network_sibling:       # only the network shared, files apart
            box.run("(setsid python3 -m http.server 8765 --bind 127.0.0.1 --directory /app/in "
                    ">/dev/null 2>&1 &); sleep 1")
            with box.network_sibling() as sibling:
                assert sibling.alive() and sibling.backend == backend
                assert sibling.read_file("/app/in/g.txt") == b"two"
                sibling.write_file("/app/in/g.txt", "sibling's")
                r = sibling.run_fresh("python3 -c 'import urllib.request as u; print(u.urlopen("
                                      "\"http://127.0.0.1:8765/g.txt\").read().decode())'; "
                                      "ps -e -o args | grep -c '[h]ttp.server'")
                assert r.output.split() == ["two", "0"], r.output   # its server, not its procs
            assert box.read_file("/app/in/g.txt") == b"two"
            assert box.run("ps -e -o args | grep -c '[h]ttp.server'").output.strip() == "1"
        else:
            with pytest.raises(SandboxError, match="--backend docker"):
                box.network_sibling()
    assert not box.alive()
    with pytest.raises(SandboxError, match="closed"):
        box.run("true")
    assert not Path(snap.location).exists()


BACKEND_FILE = '''\
"""A third backend in one file: the local sandbox under another name."""
from tr.envs.backends import Backend
from tr.envs.local import LocalSandbox


class MirrorSandbox(LocalSandbox):
    backend = "mirror"


class MirrorBackend(Backend):
    name = "mirror"
    disk_is_memory = True

    def sandbox_class(self):
        return MirrorSandbox


BACKEND = MirrorBackend()
'''


def test_a_third_backend_is_one_new_file(tmp_path, monkeypatch):
    (tmp_path / "tr_mirror_backend.py").write_text(BACKEND_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from tr.envs.tasks import load_suite
    from tr.envs.tasks.runner import run_task

    task = next(t for t in load_suite() if t.environment.kind == "setup")
    result, _ = run_task(task, "solution", "tr_mirror_backend",
                         base_config=SandboxConfig(**SMALL))
    assert result.strict_pass, result.log[-2000:]
    mirror = get_backend("mirror")                     # known by name once loaded
    assert isinstance(mirror, Backend) and not mirror.builds_images
    with mirror.make(SandboxConfig(**SMALL)) as box:
        snap = box.snapshot(persist=True)
        assert snap.backend == "mirror"
        discard_snapshot(snap)
        assert not Path(snap.location).exists()
