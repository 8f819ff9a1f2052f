import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def run(cmd, cwd="/tmp", env=None, input=None, timeout=20):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, input=input, capture_output=True, text=True, timeout=timeout)


def render(tmp_path, text, env, name="t.tpl"):
    p = tmp_path / name
    p.write_bytes(text.encode())
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
    base.update(env)
    return subprocess.run(["/app/render.sh", str(p)], env=base, capture_output=True, text=True, timeout=20)


def test_braced_variables_replaced(tmp_path):
    r = render(tmp_path, "Hello ${NAME}, you are ${AGE_2}.\n", {"NAME": "Ann", "AGE_2": "42"})
    assert r.returncode == 0 and r.stdout == "Hello Ann, you are 42.\n", r.stderr


def test_values_inserted_literally(tmp_path):
    value = "a&b/c\\d ${NAME} $HOME"
    r = render(tmp_path, "v=${V};", {"V": value, "NAME": "zzz"})
    assert r.returncode == 0 and r.stdout == "v=" + value + ";"


def test_unbraced_and_escaped_left_alone(tmp_path):
    text = "cost $5, home $HOME, esc $${NAME}, odd ${1x} ${} $\n"
    r = render(tmp_path, text, {"NAME": "n", "HOME": "/root"})
    assert r.returncode == 0 and r.stdout == "cost $5, home $HOME, esc ${NAME}, odd ${1x} ${} $\n"


def test_missing_variables(tmp_path):
    r = render(tmp_path, "${A} ${MISSING_ONE} ${B} ${MISSING_TWO} ${MISSING_ONE}\n", {"A": "1", "B": "2"})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == ["render.sh: missing variable: MISSING_ONE", "render.sh: missing variable: MISSING_TWO"]


def test_final_gate(tmp_path):
    text = "line1 ${A}\n${EMPTY}|$${A}|${A}${A}\n\ttab $A ${B_}"
    r = render(tmp_path, text, {"A": "x", "EMPTY": "", "B_": "\\n&"})
    assert r.returncode == 0 and r.stdout == "line1 x\n|${A}|xx\n\ttab $A \\n&", r.stderr
    r = render(tmp_path, "only escaped $${NOPE}\n", {}, name="e.tpl")
    assert r.returncode == 0 and r.stdout == "only escaped ${NOPE}\n"
    for t in (test_braced_variables_replaced, test_values_inserted_literally, test_unbraced_and_escaped_left_alone, test_missing_variables):
        t(tmp_path)
