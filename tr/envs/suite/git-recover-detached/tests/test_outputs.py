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


def is_ancestor(a, b):
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, "merge-base", "--is-ancestor", a, b]).returncode == 0


def parse_on_main(text):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "parser.py"), "w") as f:
            f.write(git("show", "main:parser.py"))
        r = subprocess.run(["python3", "-c", "from parser import parse; print(parse(%r))" % text], cwd=d,
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()


def test_rescue_branch_points_at_fix():
    assert subjects("rescue")[:2] == ["Fix parser edge case", "Add parser"]


def test_main_has_the_parser():
    assert is_ancestor("rescue", "main")
    assert parse_on_main(" a, ,b ") == "['a', 'b']"


def test_main_keeps_its_own_work():
    subs = subjects("main")
    assert "Update docs" in subs and "Fix parser edge case" in subs


def test_experiment_not_merged():
    subs = subjects("main")
    assert "Fix parser edge case" in subs and "Experiment: do not keep" not in subs
    assert "experiment.txt" not in git("ls-tree", "--name-only", "main").split()


def test_final_gate():
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
    assert is_ancestor("rescue", "main") and subjects("rescue")[0] == "Fix parser edge case"
    assert "Experiment: do not keep" not in subjects("main") and "Update docs" in subjects("main")
    assert parse_on_main("x,,y") == "['x', 'y']"
