import shutil
import subprocess
from pathlib import Path

import pytest

SRC = "/app/geom"
PRODUCTS = ('build', 'shapes', '*.o')


def fresh_copy(tmp_path):
    dst = tmp_path / "p"
    shutil.copytree(SRC, dst, symlinks=True, ignore=shutil.ignore_patterns(*PRODUCTS))
    return dst


def make(d, *args):
    return subprocess.run(["make", "-C", str(d), *args], capture_output=True, text=True, timeout=60)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, **kw)


def test_make_lib_builds_archive(tmp_path):
    d = fresh_copy(tmp_path)
    r = make(d, "lib")
    assert r.returncode == 0, r.stderr
    members = run(["ar", "t", str(d / "build/libgeom.a")]).stdout.split()
    assert sorted(members) == ["area.o", "perimeter.o"]
    assert not (d / "build/shapes").exists()


def test_default_target_links_program(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    assert run([str(d / "build/shapes"), "2"]).stdout == "area=12.566 perimeter=12.566\n"
    assert run([str(d / "build/shapes"), "0.5"]).stdout == "area=0.785 perimeter=3.142\n"
    assert (d / "build/libgeom.a").is_file()


def test_install_honours_destdir_and_prefix(tmp_path):
    d = fresh_copy(tmp_path)
    stage = tmp_path / "stage"
    r = make(d, "install", f"DESTDIR={stage}", "PREFIX=/opt/geom")
    assert r.returncode == 0, r.stderr
    assert run([str(stage / "opt/geom/bin/shapes"), "1"]).stdout == "area=3.142 perimeter=6.283\n"
    assert (stage / "opt/geom/lib/libgeom.a").is_file()
    assert (stage / "opt/geom/include/geom.h").read_text() == (d / "include/geom.h").read_text()


def test_final_gate(tmp_path):
    d = fresh_copy(tmp_path)
    assert make(d).returncode == 0
    assert make(d, "-q", "build/shapes").returncode == 0
    stage = tmp_path / "s2"
    assert make(d, "install", f"DESTDIR={stage}").returncode == 0
    assert sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file()) == [
        "usr/local/bin/shapes", "usr/local/include/geom.h", "usr/local/lib/libgeom.a"]
    assert make(d, "clean").returncode == 0 and not (d / "build").exists()
    assert (d / "src/main.c").is_file()
