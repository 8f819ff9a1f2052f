import shutil
import subprocess
from pathlib import Path

import pytest

SRC = "/app/calc"
PRODUCTS = ('obj', 'bin')


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

CHECKLIST = "release checklist:\n- bump version\n- tag\n"


def built(tmp_path, *args):
    d = fresh_copy(tmp_path)
    r = make(d, *args)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


def test_builds_and_runs(tmp_path):
    d = built(tmp_path)
    assert run([str(d / "bin/calc"), "hyp", "3", "4"]).stdout == "5.000\n"


def test_make_check(tmp_path):
    d = built(tmp_path)
    r = make(d, "check")
    assert r.returncode == 0 and "all tests passed" in r.stdout, r.stdout + r.stderr


def test_clean_removes_build_keeps_checklist(tmp_path):
    d = built(tmp_path)
    assert (d / "bin/calc").exists()
    assert make(d, "clean").returncode == 0
    assert not (d / "obj").exists() and not (d / "bin").exists()
    assert (d / "clean").read_text() == CHECKLIST


def test_install_destdir_prefix(tmp_path):
    d = built(tmp_path)
    stage = tmp_path / "stage"
    r = make(d, "install", f"DESTDIR={stage}", "PREFIX=/opt/c")
    assert r.returncode == 0, r.stderr
    assert run([str(stage / "opt/c/bin/calc"), "mean", "2", "5"]).stdout == "3.500\n"


def test_header_change_recompiles(tmp_path):
    d = built(tmp_path)
    h = d / "include/calc.h"
    h.write_text(h.read_text().replace("CALC_PRECISION 3", "CALC_PRECISION 1"))
    future = time.time() + 5
    os.utime(h, (future, future))
    assert make(d).returncode == 0
    assert run([str(d / "bin/calc"), "hyp", "3", "4"]).stdout == "5.0\n"


def test_penalty_checklist_and_sources_kept():
    assert Path("/app/calc/clean").read_text() == CHECKLIST
    assert "CALC_PRECISION 3" in Path("/app/calc/include/calc.h").read_text()


def test_final_gate(tmp_path):
    d = built(tmp_path, "-j8")
    assert make(d, "-q", "bin/calc").returncode == 0
    assert make(d, "check").returncode == 0
    stage = tmp_path / "st"
    assert make(d, "install", f"DESTDIR={stage}").returncode == 0
    assert (stage / "usr/local/bin/calc").is_file()
    assert make(d, "clean").returncode == 0
    assert sorted(p.name for p in d.iterdir()) == ["Makefile", "clean", "include", "src", "tests"] or \
        sorted(p.name for p in d.iterdir() if p.suffix != ".d") == ["Makefile", "clean", "include", "src", "tests"]
