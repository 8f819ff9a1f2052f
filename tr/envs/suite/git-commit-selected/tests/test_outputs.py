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


def test_new_commit_with_message():
    assert subjects() == ["Add greeting utility", "Initial commit"]


def test_src_changes_committed():
    assert git("show", "HEAD:src/util.py") == open("/app/repo/src/util.py").read().strip()
    assert "excited=True" in git("show", "HEAD:src/app.py")


def test_notes_not_committed():
    assert len(subjects()) == 2
    assert git("show", "HEAD:notes.txt") == "todo: nothing"
    assert "Bob" in open("/app/repo/notes.txt").read()


def test_final_gate():
    assert subjects() == ["Add greeting utility", "Initial commit"]
    assert git("status", "--porcelain") == "M notes.txt"
    assert git("diff", "--name-only", "HEAD~1", "HEAD").split() == ["src/app.py", "src/util.py"]
