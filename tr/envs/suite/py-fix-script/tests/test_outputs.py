import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would


def run(cmd, cwd="/tmp", env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=20, **kw)


def test_runs_with_python3():
    r = run(["python3", "/app/tool.py", "3", "4"])
    assert r.returncode == 0 and r.stdout == "7\n", r.stderr


def test_sums_any_number_of_arguments():
    assert run(["python3", "/app/tool.py", "1", "2", "3", "-10"]).stdout == "-4\n"
    assert run(["python3", "/app/tool.py"]).stdout == "0\n"


def test_directly_executable():
    r = run(["/app/tool.py", "20", "22"])
    assert r.returncode == 0 and r.stdout == "42\n", r.stderr


def test_final_gate():
    assert Path("/app/tool.py").read_text().startswith("#!") and "python3" in Path("/app/tool.py").read_text().splitlines()[0]
    assert run(["/app/tool.py", "5", "6", "7"]).stdout == "18\n"
    assert run(["/app/tool.py"]).stdout == "0\n"
