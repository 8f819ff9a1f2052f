import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def run(cmd, cwd="/tmp", env=None, input=None, timeout=20):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, input=input, capture_output=True, text=True, timeout=timeout)

FLAKY = "#!/bin/sh\nn=$(cat \"$1\" 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n > \"$1\"\necho \"run $n\"\n[ $n -ge $2 ] && exit 0\nexit $3\n"


def flaky(tmp_path):
    p = tmp_path / "flaky.sh"
    p.write_text(FLAKY)
    p.chmod(0o755)
    return str(p), str(tmp_path / "count")


def count(c):
    return int(Path(c).read_text())


def test_succeeds_after_failures(tmp_path):
    f, c = flaky(tmp_path)
    r = run(["/app/retry.sh", "-n", "5", "-d", "0", "--", f, c, "3", "7"])
    assert r.returncode == 0 and count(c) == 3
    assert r.stdout.splitlines() == ["run 1", "run 2", "run 3"]


def test_gives_up_with_last_status(tmp_path):
    f, c = flaky(tmp_path)
    r = run(["/app/retry.sh", "-n", "2", "-d", "0", "--", f, c, "10", "7"])
    assert r.returncode == 7 and count(c) == 2


def test_failure_messages(tmp_path):
    f, c = flaky(tmp_path)
    r = run(["/app/retry.sh", "-n", "2", "-d", "0", "--", f, c, "10", "5"])
    assert r.stderr.splitlines() == ["attempt 1/2 failed with status 5", "attempt 2/2 failed with status 5"]


def test_arguments_passed_exactly(tmp_path):
    r = run(["/app/retry.sh", "-n", "1", "-d", "0", "--", "printf", "%s|", "a  b", "c*", "", "$HOME"], cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == "a  b|c*||$HOME|"


def test_default_attempts(tmp_path):
    f, c = flaky(tmp_path)
    r = run(["/app/retry.sh", "-d", "0", "--", f, c, "10", "4"])
    assert r.returncode == 4 and count(c) == 3


def test_final_gate(tmp_path):
    for i, t in enumerate([test_succeeds_after_failures, test_gives_up_with_last_status, test_failure_messages,
                           test_arguments_passed_exactly, test_default_attempts]):
        d = tmp_path / str(i)
        d.mkdir()
        t(d)
    f, c = flaky(tmp_path)
    r = run(["/app/retry.sh", "-d", "0.1", "-n", "2", "--", f, c, "2", "9"])
    assert r.returncode == 0 and count(c) == 2 and r.stderr == "attempt 1/2 failed with status 9\n"
