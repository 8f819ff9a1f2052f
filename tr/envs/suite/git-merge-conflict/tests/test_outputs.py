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


def call(expr):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "greet.py"), "w") as f:
            f.write(git("show", "main:greet.py"))
        r = subprocess.run(["python3", "-c", "from greet import greet; print(repr(%s))" % expr], cwd=d,
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()


def test_merge_commit_on_main():
    parents = git("rev-list", "--parents", "-n", "1", "main").split()[1:]
    assert len(parents) == 2
    assert git("rev-parse", "feature") in parents


def test_no_conflict_markers_left():
    merged = subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, "merge-base", "--is-ancestor", "feature", "main"])
    assert merged.returncode == 0, "feature is not merged into main"
    text = open("/app/repo/greet.py").read()
    assert "<<<<<<<" not in text and ">>>>>>>" not in text and "=======" not in text
    assert not os.path.exists("/app/repo/.git/MERGE_HEAD")


def test_punctuation_option():
    assert call('greet("Ann", punctuation="?")') == "'Hello, Ann?'"
    assert call('greet("Bob", punctuation="?", shout=True)') == "'HELLO, BOB?'"


def test_shout_option():
    assert call('greet("Ann", shout=True)') == "'HELLO, ANN!'"
    assert call('greet("Cy")') == "'Hello, Cy!'"


def test_final_gate():
    test_merge_commit_on_main()
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
    assert git("show", "main:FEATURE.md").startswith("shout=True")
    assert call('greet("Bob", punctuation="?", shout=True)') == "'HELLO, BOB?'"
    assert call('greet("Ann", punctuation=".")') == "'Hello, Ann.'"
