import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would


def run(cmd, cwd="/tmp", env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=20, **kw)

ENV = {"PYTHONPATH": "/app"}


def py(code):
    return run(["python3", "-c", code], env=ENV)


def test_clean():
    r = py("import textkit; print(repr(textkit.clean('  Hello \\t  WORLD\\n ')))")
    assert r.stdout.strip() == "'hello world'", r.stderr


def test_word_count():
    r = py("import textkit; print(textkit.word_count('a  b\\n c'), textkit.word_count('   '))")
    assert r.stdout.strip() == "3 0", r.stderr


def test_module_cli(tmp_path):
    (tmp_path / "x.txt").write_text("The quick  brown\nfox\n")
    (tmp_path / "y.txt").write_text("")
    r = run(["python3", "-m", "textkit", str(tmp_path / "x.txt"), str(tmp_path / "y.txt")], env=ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["4 %s" % (tmp_path / "x.txt"), "0 %s" % (tmp_path / "y.txt")]


def test_final_gate(tmp_path):
    for first in ("textkit.stats", "textkit.normalize", "textkit"):
        r = py("import %s; from textkit import *; print(word_count(clean(' A b ')))" % first)
        assert r.stdout.strip() == "2", r.stderr
    r = py("import textkit.stats, textkit.normalize; print(textkit.stats.word_count is textkit.word_count, textkit.normalize.clean is textkit.clean)")
    assert r.stdout.strip() == "True True"
    test_module_cli(tmp_path)
