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


def settle(p, cond):
    wait_for(lambda: cond() or p.poll() is not None)
    return cond()


@pytest.fixture
def daemon(tmp_path):
    (tmp_path / "config").write_text("message=hello world\n")
    p = subprocess.Popen(["/app/daemon", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = wait_for(lambda: read(tmp_path / "status").startswith("running"))
    yield p, tmp_path, started
    if p.poll() is None:
        p.kill()
    p.wait()


def test_starts_and_reports(daemon):
    p, d, started = daemon
    assert started and read(d / "status") == "running reloads=0 message=hello world\n"
    assert p.poll() is None


def test_reload_on_hup(daemon):
    p, d, started = daemon
    assert started
    (d / "config").write_text("message=second\n")
    p.send_signal(signal.SIGHUP)
    assert settle(p, lambda: read(d / "status") == "running reloads=1 message=second\n"), read(d / "status")
    (d / "config").write_text("message=third one\n")
    p.send_signal(signal.SIGHUP)
    assert settle(p, lambda: read(d / "status") == "running reloads=2 message=third one\n"), read(d / "status")


def test_usr1_appends_message(daemon):
    p, d, started = daemon
    assert started
    p.send_signal(signal.SIGUSR1)
    assert settle(p, lambda: read(d / "out.log") == "hello world\n")
    p.send_signal(signal.SIGUSR1)
    assert settle(p, lambda: read(d / "out.log") == "hello world\nhello world\n")
    assert p.poll() is None


def test_term_stops_cleanly(daemon):
    p, d, started = daemon
    assert started and p.poll() is None
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=5) == 0
    assert read(d / "status") == "stopped reloads=0\n"


def test_final_gate(daemon):
    p, d, started = daemon
    assert started
    (d / "config").write_text("message=x\n")
    p.send_signal(signal.SIGHUP)
    assert settle(p, lambda: read(d / "status") == "running reloads=1 message=x\n")
    p.send_signal(signal.SIGUSR1)
    assert settle(p, lambda: read(d / "out.log") == "x\n")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=5) == 0
    assert read(d / "status") == "stopped reloads=1\n"
    assert sorted(x.name for x in d.iterdir()) == ["config", "out.log", "status"]
