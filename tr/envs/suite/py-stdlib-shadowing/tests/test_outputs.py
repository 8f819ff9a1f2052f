import os
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)  # run the agent's code as the agent would


def run(cmd, cwd="/tmp", env=None, **kw):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=20, **kw)

import json
import sys

REPORT = Path("/app/report")


def expected(rows):
    import http.client
    out = []
    for r in rows:
        t = " ".join(w[:1].upper() + w[1:].lower() for w in r["name"].split())
        out.append("%s | %s <%s> | %s" % (t, r["name"], r["email"].lower(), http.client.responses[r["status"]]))
    return "\n".join(out) + "\n"


def test_email_helper_renamed():
    assert not (REPORT / "email.py").exists() and not (REPORT / "email.pyc").exists()
    assert "def format_address" in (REPORT / "email_utils.py").read_text()


def test_string_helper_renamed():
    assert not (REPORT / "string.py").exists() and not (REPORT / "string.pyc").exists()
    assert "def title" in (REPORT / "string_utils.py").read_text()


def test_no_module_shadows_stdlib():
    assert (REPORT / "email_utils.py").exists()
    for p in REPORT.iterdir():
        if p.suffix in (".py", ".pyc") or p.is_dir() and (p / "__init__.py").exists():
            assert p.stem not in sys.stdlib_module_names, p


def test_runs_on_sample():
    r = run(["python3", "/app/report/main.py", "/app/report/sample.json"])
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout == expected(json.loads((REPORT / "sample.json").read_text()))


def test_final_gate(tmp_path):
    rows = [{"name": "linus  TORVALDS", "email": "Linus@Kernel.example", "status": 503},
            {"name": "barbara", "email": "b@x.example", "status": 201}]
    (tmp_path / "in.json").write_text(json.dumps(rows))
    r = run(["python3", "/app/report/main.py", str(tmp_path / "in.json")], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout == expected(rows)
    test_runs_on_sample()
    test_no_module_shadows_stdlib()
