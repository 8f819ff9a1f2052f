import shutil
import subprocess
from pathlib import Path

import pytest

SRC = "/app/stats"
PRODUCTS = ('app', '*.o', '*.d')


def fresh_copy(tmp_path):
    dst = tmp_path / "p"
    shutil.copytree(SRC, dst, symlinks=True, ignore=shutil.ignore_patterns(*PRODUCTS))
    return dst


def make(d, *args):
    return subprocess.run(["make", "-C", str(d), *args], capture_output=True, text=True, timeout=60)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, **kw)

import os
import time


def bump(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    future = time.time() + 5
    os.utime(path, (future, future))


def test_builds(tmp_path):
    d = fresh_copy(tmp_path)
    r = make(d)
    assert r.returncode == 0, r.stderr
    assert run([str(d / "app"), "1", "2", "3", "4"]).stdout == "mean=2.50 scaled=25.0\n"


def test_config_change_rebuilds(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    bump(d / "config.h", "SCALE 10", "SCALE 100")
    assert make(d).returncode == 0
    assert run([str(d / "app"), "1", "2", "3", "4"]).stdout == "mean=2.50 scaled=250.0\n"


def test_stats_header_change_rebuilds_both_objects(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    bump(d / "stats.h", "double mean", "double  mean")
    plan = make(d, "-n").stdout
    assert "main.c" in plan and "stats.c" in plan


def test_penalty_sources_unchanged():
    assert Path("/app/stats/config.h").read_text() == "#define SCALE 10\n"
    assert "m * SCALE" in Path("/app/stats/main.c").read_text()


def test_final_gate(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d, "-j4").returncode == 0
    assert make(d, "-q", "app").returncode == 0, "make is not idempotent"
    assert run([str(d / "app"), "2", "4"]).stdout == "mean=3.00 scaled=30.0\n"
    bump(d / "config.h", "SCALE 10", "SCALE 3")
    assert make(d).returncode == 0
    assert run([str(d / "app"), "2", "4"]).stdout == "mean=3.00 scaled=9.0\n"
