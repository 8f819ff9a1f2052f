import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would


def run(cmd, cwd="/tmp", env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=20, **kw)

VPY = "/app/.venv/bin/python"


def test_virtualenv_created():
    r = run([VPY, "-c", "import sys; print(sys.prefix != sys.base_prefix, sys.prefix)"])
    assert r.stdout.split() == ["True", "/app/.venv"], r.stderr
    assert Path("/app/.venv/pyvenv.cfg").is_file()


def test_package_imported_from_source():
    r = run([VPY, "-c", "import greetlib; print(greetlib.__file__, greetlib.__version__)"])
    assert r.stdout.split() == ["/app/src/greetlib/__init__.py", "0.3.0"], r.stderr


def test_greet_command():
    r = run(["/app/.venv/bin/greet", "Bob"])
    assert r.returncode == 0 and r.stdout == "Hello, Bob!\n", r.stderr
    assert run(["/app/.venv/bin/greet", "--shout", "Ann", "Cy"]).stdout == "HELLO, ANN!\nHELLO, CY!\n"


def test_final_gate():
    test_virtualenv_created()
    test_package_imported_from_source()
    test_greet_command()
    assert run(["python3", "-c", "import greetlib"]).returncode != 0
    assert not list(Path("/app/.venv/lib").rglob("greetlib/__init__.py"))
    assert run(["/app/.venv/bin/greet", "--shout"], env={"PATH": "/usr/bin:/bin"}).stdout == "HELLO, WORLD!\n"
