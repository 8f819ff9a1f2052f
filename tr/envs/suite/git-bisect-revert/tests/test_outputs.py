import os
import subprocess

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would

REPO = "/app/repo"


def git(*args, check=True):
    r = subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, *args], capture_output=True, text=True, timeout=20)
    if check:
        assert r.returncode == 0, (args, r.stderr)
    return r.stdout.strip()


def subjects(rev="HEAD"):
    return git("log", "--format=%s", rev).splitlines()

import os
import tempfile


def bad_hash():
    for line in git("log", "--format=%H %s", "main").splitlines():
        h, s = line.split(" ", 1)
        if s == "Step 13":
            return h
    raise AssertionError("original history is gone")


def step24():
    return git("log", "--all", "--format=%H", "--grep=^Step 24$")


def test_first_bad_commit_recorded():
    assert open("/app/first_bad.txt").read().strip() == bad_hash()


def test_revert_commit_on_main():
    assert ("This reverts commit %s" % bad_hash()) in git("log", "--format=%B", "main")


def test_history_not_rewritten():
    subs = subjects("main")
    assert subs[0] != "Step 24"
    assert [s for s in subs if s.startswith("Step ")] == ["Step %02d" % i for i in range(24, 0, -1)]
    assert subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, "merge-base", "--is-ancestor", step24(), "main"]).returncode == 0


def test_check_passes_on_main():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["git", "-c", "safe.directory=*", "clone", "-q", "--branch", "main", REPO, d + "/c"], check=True, timeout=20)
        r = subprocess.run(["sh", "./check.sh"], cwd=d + "/c", capture_output=True, timeout=20)
        assert r.returncode == 0


def test_final_gate():
    test_first_bad_commit_recorded()
    test_revert_commit_on_main()
    test_history_not_rewritten()
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    assert git("status", "--porcelain", "--untracked-files=no") == ""
    assert "def total" in git("show", "main:mathlib.py") and "sum(xs) / len(xs)" in git("show", "main:mathlib.py")
    assert subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, "bisect", "log"], capture_output=True).returncode != 0
