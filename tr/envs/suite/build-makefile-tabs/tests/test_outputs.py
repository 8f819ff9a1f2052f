import shutil
import subprocess
from pathlib import Path

import pytest

SRC = "/app/hello"
PRODUCTS = ('hello', '*.o')


def fresh_copy(tmp_path):
    dst = tmp_path / "p"
    shutil.copytree(SRC, dst, symlinks=True, ignore=shutil.ignore_patterns(*PRODUCTS))
    return dst


def make(d, *args):
    return subprocess.run(["make", "-C", str(d), *args], capture_output=True, text=True, timeout=60)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, **kw)


def test_make_builds_hello(tmp_path):
    d = fresh_copy(tmp_path)
    r = make(d)
    assert r.returncode == 0, r.stderr
    assert (d / "hello").is_file()


def test_hello_runs(tmp_path):
    d = fresh_copy(tmp_path)
    make(d)
    assert run([str(d / "hello")]).stdout == "Hello, make!\n"


def test_clean_removes_products(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    r = make(d, "clean")
    assert r.returncode == 0, r.stderr
    assert not (d / "hello").exists() and not (d / "hello.o").exists()
    assert (d / "hello.c").is_file()


def test_penalty_source_unchanged():
    assert 'puts("Hello, make!");' in Path("/app/hello/hello.c").read_text()


def test_final_gate(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    assert make(d, "-q", "hello").returncode == 0, "second make would rebuild"
    assert run([str(d / "hello")]).stdout == "Hello, make!\n"
    assert make(d, "clean").returncode == 0 and sorted(p.name for p in d.iterdir()) == ["Makefile", "hello.c"]
