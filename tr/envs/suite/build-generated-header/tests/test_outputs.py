import shutil
import subprocess
from pathlib import Path

import pytest

SRC = "/app/ver"
PRODUCTS = ('build',)


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


def test_make_from_clean(tmp_path):
    d = fresh_copy(tmp_path)
    r = make(d)
    assert r.returncode == 0, r.stderr
    assert run([str(d / "build/app")]).stdout == "app 1.4.2\n"


def test_app_target_alone_from_clean(tmp_path):
    d = fresh_copy(tmp_path)
    r = make(d, "build/app")
    assert r.returncode == 0, r.stderr
    assert run([str(d / "build/app")]).stdout == "app 1.4.2\n"


def test_version_change_rebuilds(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    (d / "VERSION").write_text("2.0.0\n")
    future = time.time() + 5
    os.utime(d / "VERSION", (future, future))
    assert make(d).returncode == 0
    assert run([str(d / "build/app")]).stdout == "app 2.0.0\n"


def test_penalty_sources_unchanged():
    assert Path("/app/ver/VERSION").read_text() == "1.4.2\n"
    assert '#include "version.h"' in Path("/app/ver/src/main.c").read_text()


def test_final_gate(tmp_path):
    for i in range(3):
        d = fresh_copy(tmp_path / str(i))
        r = make(d, "-j8")
        assert r.returncode == 0, r.stderr
        assert run([str(d / "build/app")]).stdout == "app 1.4.2\n"
    assert make(d, "-q", "build/app").returncode == 0
    assert run(["sh", str(d / "gen_version.sh"), str(d / "VERSION")]).stdout == '#define APP_VERSION "1.4.2"\n'
    test_app_target_alone_from_clean(tmp_path / "alone")
    test_version_change_rebuilds(tmp_path / "bump")
