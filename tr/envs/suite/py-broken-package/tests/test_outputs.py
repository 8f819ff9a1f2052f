import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would


def run(cmd, cwd="/tmp", env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=20, **kw)

import json

NOTELY = "/app/notely/bin/notely"
HELP = 'notely - tiny notes\n\n  notely add TEXT   store a note\n  notely list       show all notes\n  notely help       this text\n'


def env(tmp_path, **extra):
    e = {"NOTELY_DB": str(tmp_path / "db.json"), "HOME": str(tmp_path / "home")}
    e.update(extra)
    (tmp_path / "home").mkdir(exist_ok=True)
    return e


def subdir(tmp_path, name):
    (tmp_path / name).mkdir()
    return tmp_path / name


def test_wrapper_add_from_any_directory(tmp_path):
    r = run([NOTELY, "add", "buy", "milk"], cwd=str(tmp_path), env=env(tmp_path))
    assert r.returncode == 0 and r.stdout == "added #1\n", r.stderr[-1500:]


def test_notes_persist_in_notely_db(tmp_path):
    e = env(tmp_path)
    run([NOTELY, "add", "first"], env=e)
    run([NOTELY, "add", "second note"], env=e)
    r = run([NOTELY, "list"], env=e)
    assert r.stdout == "1: first\n2: second note\n", r.stderr[-1500:]
    assert [n["text"] for n in json.loads((tmp_path / "db.json").read_text())] == ["first", "second note"]
    assert not (tmp_path / "home" / ".notely.json").exists()


def test_help_text(tmp_path):
    r = run([NOTELY, "help"], cwd=str(tmp_path), env=env(tmp_path))
    assert r.stdout == HELP, r.stderr[-1500:]


def test_python_dash_m(tmp_path):
    e = env(tmp_path, PYTHONPATH="/app/notely/src")
    assert run(["python3", "-m", "notely", "add", "via -m"], env=e).stdout == "added #1\n"
    r = run(["python3", "-m", "notely", "list"], env=e)
    assert r.stdout == "1: via -m\n", r.stderr[-1500:]


def test_modules_import_cleanly(tmp_path):
    e = env(tmp_path, PYTHONPATH="/app/notely/src")
    for mod in ("notely.models", "notely.storage", "notely.commands"):
        r = run(["python3", "-c", "import %s, notely; print(notely.__version__)" % mod], env=e)
        assert r.stdout.strip() == "1.2.0", (mod, r.stderr[-800:])


def test_final_gate(tmp_path):
    e = env(tmp_path)
    e.pop("NOTELY_DB")
    assert run([NOTELY, "add", "home default"], env=e).stdout == "added #1\n"
    assert run([NOTELY, "list"], env=e).stdout == "1: home default\n"
    assert (tmp_path / "home" / ".notely.json").is_file()
    test_wrapper_add_from_any_directory(subdir(tmp_path, "a"))
    test_notes_persist_in_notely_db(subdir(tmp_path, "b"))
    test_help_text(tmp_path)
    test_python_dash_m(subdir(tmp_path, "c"))
    test_modules_import_cleanly(tmp_path)
