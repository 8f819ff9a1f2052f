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

import fcntl
import json

COUNTER = r"""python3 - "$@" <<'PY'
import fcntl, json, os, sys, time
path = sys.argv[1]
def update(delta):
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.load(open(path))
        except (FileNotFoundError, ValueError):
            state = {"now": 0, "max": 0}
        state["now"] += delta
        state["max"] = max(state["max"], state["now"])
        json.dump(state, open(path, "w"))
update(1)
time.sleep(float(sys.argv[2]))
update(-1)
PY
"""


def setup_jobs(tmp_path, lines):
    (tmp_path / "count.sh").write_text(COUNTER)
    (tmp_path / "jobs.txt").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "jobs.txt")


def runjobs(*args, timeout=60):
    return subprocess.run(["/app/runjobs.sh", *args], capture_output=True, text=True, timeout=timeout)


def barrier(tmp_path, me, other):
    return (f"touch {tmp_path}/{me}; for i in $(seq 30); do [ -e {tmp_path}/{other} ] && exit 0; sleep 0.05; done; exit 9")


def test_runs_jobs_and_logs_by_line(tmp_path):
    jf = setup_jobs(tmp_path, ["echo first", "", "# comment", "echo out; echo err >&2", "exit 3"])
    r = runjobs("-j", "2", jf)
    assert r.stdout.strip() == "ok 2 failed 1" and r.returncode == 1, (r.stdout, r.stderr)
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["1.log", "4.log", "5.log"]
    assert (logs / "1.log").read_text() == "first\n"
    assert sorted((logs / "4.log").read_text().split()) == ["err", "out"]


def test_jobs_run_concurrently(tmp_path):
    jf = setup_jobs(tmp_path, [barrier(tmp_path, "a", "b"), barrier(tmp_path, "b", "a")])
    r = runjobs("-j", "2", jf)
    assert r.returncode == 0 and r.stdout.strip() == "ok 2 failed 0", (r.stdout, r.stderr)


def test_never_more_than_n(tmp_path):
    state = tmp_path / "state.json"
    jf = setup_jobs(tmp_path, [f"bash {tmp_path}/count.sh {state} 0.3"] * 5)
    r = runjobs("-j", "3", jf)
    assert r.returncode == 0 and r.stdout.strip() == "ok 5 failed 0", (r.stdout, r.stderr)
    s = json.loads(state.read_text())
    assert s["now"] == 0 and 2 <= s["max"] <= 3, s


def test_usage_errors(tmp_path):
    jf = setup_jobs(tmp_path, ["true"])
    for args in ([], ["-j", "0", jf], ["-j", "x", jf], ["-j", "2", str(tmp_path / "missing")], [jf]):
        r = runjobs(*args)
        assert r.returncode == 2 and r.stderr.strip(), args
    assert not (tmp_path / "logs").exists()


def test_final_gate(tmp_path):
    for i, t in enumerate([test_runs_jobs_and_logs_by_line, test_jobs_run_concurrently, test_usage_errors]):
        d = tmp_path / str(i)
        d.mkdir()
        t(d)
    jf = setup_jobs(tmp_path, [barrier(tmp_path, "x", "y"), "sleep 0.2", barrier(tmp_path, "y", "x")])
    r = runjobs("-j", "2", jf)
    assert r.returncode == 0 and r.stdout.strip() == "ok 3 failed 0", (r.stdout, r.stderr)
