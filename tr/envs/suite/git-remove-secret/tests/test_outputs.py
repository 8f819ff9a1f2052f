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


def commits_with_secret():
    hits = []
    for rev in git("rev-list", "--all").split():
        if "secrets.env" in git("ls-tree", "-r", "--name-only", rev).split():
            hits.append(rev)
    return hits


def test_secret_in_no_commit():
    assert commits_with_secret() == []


def test_config_loader_commit_kept():
    assert "Add config loader" in subjects()
    files = git("ls-tree", "-r", "--name-only", "HEAD").split()
    assert "config.py" in files and "secrets.env" not in files


def test_secret_kept_locally_and_ignored():
    assert open("/app/repo/secrets.env").read() == "DB_PASSWORD=hunter2\nAPI_TOKEN=tok_live_8f2a\n"
    assert subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, "check-ignore", "-q", "secrets.env"]).returncode == 0
    assert ".gitignore" in git("ls-tree", "--name-only", "HEAD").split()


def test_final_gate():
    assert commits_with_secret() == []
    assert git("status", "--porcelain") == ""
    subs = subjects()
    assert subs[-2:] == ["Add app entry point", "Initial commit"] and "Add config loader" in subs
    assert "def load" in git("show", "HEAD:config.py")
