import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def run(cmd, cwd="/tmp", env=None, input=None, timeout=20):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, input=input, capture_output=True, text=True, timeout=timeout)


def files(tmp_path):
    a = tmp_path / "a.txt"
    b = tmp_path / "b file.txt"
    a.write_text("Error one\nerror two\nfine\nan a.b line\n")
    b.write_text("ERROR\naxb\nnothing\n")
    return str(a), str(b)


def test_plain_counts(tmp_path):
    a, b = files(tmp_path)
    r = run(["/app/count.sh", "error", a, b])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{a}: 1", f"{b}: 0", "total: 1"]


def test_fixed_string_not_regex(tmp_path):
    a, b = files(tmp_path)
    r = run(["/app/count.sh", "a.b", a, b])
    assert r.stdout.splitlines() == [f"{a}: 1", f"{b}: 0", "total: 1"]


def test_ignore_case_and_invert(tmp_path):
    a, b = files(tmp_path)
    assert run(["/app/count.sh", "-i", "error", a, b]).stdout.splitlines() == [f"{a}: 2", f"{b}: 1", "total: 3"]
    assert run(["/app/count.sh", "-v", "error", a]).stdout.splitlines() == [f"{a}: 3", "total: 3"]
    assert run(["/app/count.sh", "-iv", "error", a, b]).stdout.splitlines() == [f"{a}: 2", f"{b}: 2", "total: 4"]


def test_errors(tmp_path):
    a, _ = files(tmp_path)
    r = run(["/app/count.sh", "error"])
    assert r.returncode == 2 and r.stderr.strip() and not r.stdout.strip()
    r = run(["/app/count.sh", "error", str(tmp_path / "missing.txt"), a])
    assert r.returncode == 1
    assert r.stdout.splitlines() == [f"{a}: 1", "total: 1"]
    assert f"count.sh: {tmp_path / 'missing.txt'}: no such file" in r.stderr


def test_final_gate(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    test_plain_counts(first)
    a, b = files(tmp_path)
    assert run(["/app/count.sh", "-i", "-v", "ERROR", b]).stdout.splitlines() == [f"{b}: 2", "total: 2"]
    test_errors(tmp_path)
