import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def run(cmd, cwd="/tmp", env=None, input=None, timeout=20):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, input=input, capture_output=True, text=True, timeout=timeout)

import tarfile


def tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")


def members(archive):
    with tarfile.open(archive, "r:gz") as t:
        return {m.name: (t.extractfile(m).read().decode() if m.isfile() else None) for m in t.getmembers()}


def test_creates_archive(tmp_path):
    tree(tmp_path / "proj")
    r = run(["/app/backup.sh", str(tmp_path / "proj"), str(tmp_path / "out")])
    assert r.returncode == 0, r.stderr
    m = members(tmp_path / "out" / "proj.tar.gz")
    assert m["proj/a.txt"] == "alpha\n" and m["proj/sub/b.txt"] == "beta\n"


def test_missing_source_fails_cleanly(tmp_path):
    r = run(["/app/backup.sh", str(tmp_path / "nope"), str(tmp_path / "out")])
    assert r.returncode == 1 and r.stderr.strip()
    assert not (tmp_path / "out").exists()


def test_paths_with_spaces(tmp_path):
    tree(tmp_path / "my docs")
    r = run(["/app/backup.sh", str(tmp_path / "my docs"), str(tmp_path / "back ups")])
    assert r.returncode == 0, r.stderr
    assert members(tmp_path / "back ups" / "my docs.tar.gz")["my docs/a.txt"] == "alpha\n"


def test_final_gate(tmp_path):
    test_creates_archive(tmp_path / "1")
    test_missing_source_fails_cleanly(tmp_path / "2")
    test_paths_with_spaces(tmp_path / "3")
    assert set(members(tmp_path / "1" / "out" / "proj.tar.gz")) <= {"proj", "proj/a.txt", "proj/sub", "proj/sub/b.txt"}
