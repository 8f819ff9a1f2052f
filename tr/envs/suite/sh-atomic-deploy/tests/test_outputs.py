import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def run(cmd, cwd="/tmp", env=None, input=None, timeout=20):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, input=input, capture_output=True, text=True, timeout=timeout)

import fcntl
import io
import tarfile


def tarball(tmp_path, name, healthy=True, with_check=True):
    path = tmp_path / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        files = {"app.txt": f"version {name}\n"}
        if with_check:
            files["healthcheck.sh"] = "#!/bin/sh\ntest -f app.txt\nexit %d\n" % (0 if healthy else 3)
        for fname, text in files.items():
            info = tarfile.TarInfo(fname)
            data = text.encode()
            info.size = len(data)
            info.mode = 0o755 if fname.endswith(".sh") else 0o644
            t.addfile(info, io.BytesIO(data))
    return str(path)


def deploy(root, tb):
    return run(["/app/deploy.sh", tb], env={"DEPLOY_ROOT": str(root)})


def state(root):
    rels = sorted(p.name for p in (root / "releases").iterdir()) if (root / "releases").is_dir() else []
    cur = root / "current"
    target = os.path.realpath(cur) if cur.is_symlink() else None
    extra = sorted(p.name for p in root.iterdir() if p.name not in ("releases", "current", ".deploy.lock"))
    return rels, target, extra


def test_first_deploy(tmp_path):
    root = tmp_path / "root"
    r = deploy(root, tarball(tmp_path, "r001"))
    assert r.returncode == 0, r.stderr
    assert (root / "current").is_symlink()
    assert (root / "current" / "app.txt").read_text() == "version r001\n"
    assert state(root) == (["r001"], str(root / "releases" / "r001"), [])


def test_keeps_three_newest(tmp_path):
    root = tmp_path / "root"
    for i in range(1, 6):
        assert deploy(root, tarball(tmp_path, "r%03d" % i)).returncode == 0
    assert state(root) == (["r003", "r004", "r005"], str(root / "releases" / "r005"), [])


def test_failed_health_check_changes_nothing(tmp_path):
    root = tmp_path / "root"
    assert deploy(root, tarball(tmp_path, "r001")).returncode == 0
    before = state(root)
    r = deploy(root, tarball(tmp_path, "r002", healthy=False))
    assert r.returncode == 1
    r = deploy(root, tarball(tmp_path, "r003", with_check=False))
    assert r.returncode == 1
    assert state(root) == before == (["r001"], str(root / "releases" / "r001"), [])


def test_corrupt_tarball_changes_nothing(tmp_path):
    root = tmp_path / "root"
    assert deploy(root, tarball(tmp_path, "r001")).returncode == 0
    bad = tmp_path / "r009.tar.gz"
    bad.write_bytes(b"this is not gzip")
    assert deploy(root, str(bad)).returncode == 1
    assert state(root) == (["r001"], str(root / "releases" / "r001"), [])


def test_lock_held_exits_75(tmp_path):
    root = tmp_path / "root"
    assert deploy(root, tarball(tmp_path, "r001")).returncode == 0
    with open(root / ".deploy.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run(["/app/deploy.sh", tarball(tmp_path, "r002")], env={"DEPLOY_ROOT": str(root)}, timeout=10)
        assert r.returncode == 75
    assert state(root) == (["r001"], str(root / "releases" / "r001"), [])


def test_final_gate(tmp_path):
    for i, t in enumerate([test_first_deploy, test_keeps_three_newest, test_failed_health_check_changes_nothing,
                           test_corrupt_tarball_changes_nothing, test_lock_held_exits_75]):
        d = tmp_path / str(i)
        d.mkdir()
        t(d)
    r = run(["/app/deploy.sh"])
    assert r.returncode == 2 and r.stderr.strip()
