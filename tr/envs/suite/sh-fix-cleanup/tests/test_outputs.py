import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def run(cmd, cwd="/tmp", env=None, input=None, timeout=20):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, input=input, capture_output=True, text=True, timeout=timeout)

import time

HOUR = 3600
OLD = ["old.tmp", "old file.tmp", "sub/deep one.tmp"]
KEEP = ["recent.tmp", "keep.tmp.bak", "notes.txt", "cache.tmp/inner.txt"]


def tree(root):
    now = time.time()
    ages = {"old.tmp": 72, "old file.tmp": 50, "sub/deep one.tmp": 36, "recent.tmp": 2,
            "keep.tmp.bak": 72, "notes.txt": 72, "cache.tmp/inner.txt": 72}
    for rel, hours in ages.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
        os.utime(p, (now - hours * HOUR, now - hours * HOUR))
    os.utime(root / "cache.tmp", (now - 72 * HOUR, now - 72 * HOUR))
    return root


def test_removes_old_tmp_files(tmp_path):
    root = tree(tmp_path / "t")
    run(["/app/cleanup.sh", str(root), "1"], cwd=str(tmp_path))
    assert [rel for rel in OLD if (root / rel).exists()] == []


def test_keeps_others_and_reports_count(tmp_path):
    root = tree(tmp_path / "t")
    r = run(["/app/cleanup.sh", str(root), "1"], cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == "removed 3 files\n", (r.stdout, r.stderr)
    assert all((root / rel).exists() for rel in KEEP)


def test_bad_arguments_delete_nothing(tmp_path):
    root = tree(tmp_path / "t")
    for args in ([], [str(root)], [str(root), "abc"], [str(root), "-1"], [str(tmp_path / "nope"), "1"]):
        r = run(["/app/cleanup.sh", *args], cwd=str(root))
        assert r.returncode == 2 and r.stderr.strip(), args
    assert all((root / rel).exists() for rel in OLD + KEEP)


def test_final_gate(tmp_path):
    root = tree(tmp_path / "t")
    assert run(["/app/cleanup.sh", str(root), "2"], cwd=str(tmp_path)).stdout == "removed 2 files\n"
    assert (root / "sub/deep one.tmp").exists()
    assert run(["/app/cleanup.sh", str(root), "0"], cwd=str(tmp_path)).stdout == "removed 2 files\n"
    assert run(["/app/cleanup.sh", str(root), "0"], cwd=str(tmp_path)).stdout == "removed 0 files\n"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(["keep.tmp.bak", "notes.txt", "cache.tmp/inner.txt"])
    test_bad_arguments_delete_nothing(tmp_path / "b")
