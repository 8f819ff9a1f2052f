import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

os.environ.pop("PYTHONSAFEPATH", None)
SVC = "/app/svc/svc.sh"


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def is_worker(pid):
    try:
        return alive(pid) and "/app/svc/worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False


class Service:
    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.seen = set()

    def __call__(self, *args, **env):
        full = dict(os.environ, SVC_RUN_DIR=str(self.run_dir), STOP_TIMEOUT="0.3", **env)
        r = subprocess.run([SVC, *args], env=full, capture_output=True, text=True, timeout=30)
        self.seen.add(self.pid())
        return r

    def pid(self):
        try:
            return int((self.run_dir / "worker.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def workers(self):
        out = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and is_worker(int(p.name)):
                try:
                    env = (p / "environ").read_bytes()
                except OSError:
                    continue
                if f"SVC_RUN_DIR={self.run_dir}\0".encode() in env + b"\0":
                    out.append(int(p.name))
        return sorted(out)

    def cleanup(self):
        for pid in set(self.workers()) | {p for p in self.seen if p and is_worker(p)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def svc(tmp_path):
    s = Service(tmp_path / "run")
    yield s
    s.cleanup()


def test_start_and_status(svc):
    r = svc("start")
    pid = svc.pid()
    assert r.returncode == 0 and r.stdout.strip() == f"started (pid {pid})", r.stderr
    assert is_worker(pid) and (svc.run_dir / "heartbeat").exists()
    r = svc("status")
    assert r.returncode == 0 and r.stdout.strip() == f"running (pid {pid})"


def test_start_twice_keeps_one_worker(svc):
    svc("start")
    first = svc.pid()
    r = svc("start")
    assert r.returncode == 0 and r.stdout.strip() == f"already running (pid {first})"
    assert svc.pid() == first and svc.workers() == [first]


def test_stop_is_graceful(svc):
    svc("start")
    pid = svc.pid()
    r = svc("stop")
    assert r.returncode == 0 and r.stdout.strip() == "stopped"
    assert not alive(pid) and not (svc.run_dir / "worker.pid").exists()
    assert "stopped cleanly" in (svc.run_dir / "worker.log").read_text()
    r = svc("status")
    assert r.returncode == 3 and r.stdout.strip() == "stopped"


def test_stop_escalates_to_kill(svc):
    svc("start", WORKER_IGNORE_TERM="1")
    pid = svc.pid()
    assert is_worker(pid)
    r = svc("stop")
    assert r.returncode == 0 and not alive(pid) and svc.workers() == []


def test_stale_pidfile_never_signals_other_process(svc):
    svc.run_dir.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "30"])
    try:
        (svc.run_dir / "worker.pid").write_text(f"{other.pid}\n")
        r = svc("status")
        assert r.returncode == 3
        r = svc("start")
        assert r.returncode == 0 and svc.pid() != other.pid and is_worker(svc.pid())
        assert svc("stop").returncode == 0
        (svc.run_dir / "worker.pid").write_text(f"{other.pid}\n")
        r = svc("stop")
        assert r.returncode == 0 and r.stdout.strip() == "not running"
        assert alive(other.pid) and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_restart_gives_new_worker(svc):
    svc("start")
    first = svc.pid()
    r = svc("restart")
    assert r.returncode == 0 and svc.pid() != first and is_worker(svc.pid()) and not alive(first)
    assert svc.workers() == [svc.pid()]


def test_final_gate(svc):
    assert svc("status").returncode == 3
    assert svc("start").returncode == 0
    first = svc.pid()
    assert svc("start").stdout.strip() == f"already running (pid {first})"
    assert svc("restart").returncode == 0
    second = svc.pid()
    assert second != first and not alive(first) and svc.workers() == [second]
    assert svc("status").stdout.strip() == f"running (pid {second})"
    assert svc("stop").stdout.strip() == "stopped" and not alive(second)
    assert svc("stop").stdout.strip() == "not running"
    assert svc("status").returncode == 3
    assert (svc.run_dir / "worker.log").read_text().count("stopped cleanly") == 2
    (svc.run_dir / "worker.pid").write_text(f"{os.getpid()}\n")
    assert svc("status").returncode == 3
    assert svc("stop").stdout.strip() == "not running" and not (svc.run_dir / "worker.pid").exists()
