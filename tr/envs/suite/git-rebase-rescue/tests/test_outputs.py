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

FEATURE = ["Add settings file", "Add retries to connect", "Add tests"]


def feature_subjects():
    return git("log", "--reverse", "--format=%s", "main..feature").splitlines()


def run_in_tree(rev, code):
    with tempfile.TemporaryDirectory() as d:
        for name in ("app.py", "test_app.py"):
            with open(os.path.join(d, name), "w") as f:
                f.write(git("show", "%s:%s" % (rev, name)) + "\n")
        r = subprocess.run(["python3", "-c", code], cwd=d, capture_output=True, text=True, timeout=10)
        return r.returncode, r.stdout.strip()


def test_rebase_finished():
    assert not os.path.exists("/app/repo/.git/rebase-merge") and not os.path.exists("/app/repo/.git/rebase-apply")
    assert not os.path.exists("/app/repo/.git/index.lock")
    assert git("symbolic-ref", "--short", "HEAD") == "feature"


def test_feature_commits_on_top_of_main():
    assert subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, "merge-base", "--is-ancestor", "main", "feature"]).returncode == 0
    assert feature_subjects()[:3] == FEATURE


def test_conflict_resolved_with_both_changes():
    code = "import app; print(app.connect('db'), app.connect('x', retries=5), hasattr(app, 'TIMEOUT'), app.TIMEOUT_S)"
    rc, out = run_in_tree("feature", code)
    assert rc == 0 and out == "connect db timeout=30 retries=3 connect x timeout=30 retries=5 False 30"


def test_stash_restored_and_committed():
    assert git("stash", "list") == ""
    assert feature_subjects()[3:] == ["Document retries"]
    assert "Retries: set `retries` in settings.ini" in git("show", "feature:README.md")


def test_final_gate():
    assert subjects("main") == ["Rename timeout constant", "Initial commit"]
    assert feature_subjects() == FEATURE + ["Document retries"]
    assert git("status", "--porcelain") == ""
    test_rebase_finished()
    rc, _ = run_in_tree("feature", "import test_app; test_app.test_connect()")
    assert rc == 0
    test_conflict_resolved_with_both_changes()
    test_stash_restored_and_committed()
