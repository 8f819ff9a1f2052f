import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.pop("PYTHONSAFEPATH", None)


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def read(path):
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return ""

CHILD = """import os, signal, sys, time
counter, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3]
n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(n))
if mode == "fail-until":
    sys.exit(0 if n >= int(arg) else 4)
if mode == "killself":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "serve":
    def term(*_):
        open(arg + ".term", "w").write("got TERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    open(arg + ".pid", "w").write(str(os.getpid()))
    while True:
        time.sleep(0.05)
"""


def child(tmp_path, mode, arg):
    (tmp_path / "child.py").write_text(CHILD)
    return ["python3", str(tmp_path / "child.py"), str(tmp_path / "count"), mode, str(arg)]


def restarts(stderr):
    return [l for l in stderr.splitlines() if l.startswith("restart ")]


def runs(tmp_path):
    return int(read(tmp_path / "count") or 0)


def sup(*args, timeout=30):
    return subprocess.run(["/app/supervise.sh", *args], capture_output=True, text=True, timeout=timeout)


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_restarts_until_success(tmp_path):
    r = sup("-r", "5", "-b", "0", "--", *child(tmp_path, "fail-until", 3))
    assert r.returncode == 0 and runs(tmp_path) == 3, r.stderr
    assert restarts(r.stderr) == ["restart 1 after exit 4", "restart 2 after exit 4"]


def test_gives_up_with_last_status(tmp_path):
    r = sup("-r", "2", "-b", "0", "--", *child(tmp_path, "fail-until", 99))
    assert r.returncode == 4 and runs(tmp_path) == 3
    assert restarts(r.stderr) == ["restart 1 after exit 4", "restart 2 after exit 4"]


def test_signal_death_reported_as_128_plus_n(tmp_path):
    r = sup("-r", "1", "-b", "0", "--", *child(tmp_path, "killself", 0))
    assert r.returncode == 137 and runs(tmp_path) == 2
    assert restarts(r.stderr) == ["restart 1 after exit 137"]


def test_exponential_backoff(tmp_path):
    start = time.monotonic()
    r = sup("-r", "3", "-b", "0.15", "--", *child(tmp_path, "fail-until", 99))
    elapsed = time.monotonic() - start
    assert r.returncode == 4 and runs(tmp_path) == 4
    assert elapsed >= 0.15 + 0.3 + 0.6, elapsed


def test_sigterm_forwarded_to_child(tmp_path):
    marker = tmp_path / "srv"
    p = subprocess.Popen(["/app/supervise.sh", "-r", "3", "-b", "0", "--", *child(tmp_path, "serve", marker)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = None
    try:
        assert wait_for(lambda: read(str(marker) + ".pid") != "" or p.poll() is not None)
        pid = int(read(str(marker) + ".pid"))
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=5) == 143
        assert read(str(marker) + ".term") == "got TERM"
        assert wait_for(lambda: not alive(pid), timeout=2)
        assert runs(tmp_path) == 1
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_final_gate(tmp_path):
    for i, t in enumerate([test_restarts_until_success, test_gives_up_with_last_status, test_sigterm_forwarded_to_child]):
        d = tmp_path / str(i)
        d.mkdir()
        t(d)
    r = sup("-b", "0", "--", *child(tmp_path, "fail-until", 99))
    assert r.returncode == 4 and runs(tmp_path) == 4
    p = subprocess.Popen(["/app/supervise.sh", "-b", "5", "--", "false"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert p.stderr.readline() == b"restart 1 after exit 1\n"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=3) == 143
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
