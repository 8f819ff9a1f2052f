import os
import stat
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)

S = "/app/site"


def test_scripts_executable():
    for name in ("deploy", "backup"):
        assert mode(f"{S}/bin/{name}") == 0o755
        assert subprocess.run([f"{S}/bin/{name}"], capture_output=True, text=True).stdout == f"{name} ok\n"


def test_secrets_private():
    assert mode(f"{S}/conf") == 0o700
    assert all(mode(p) == 0o600 for p in Path(f"{S}/conf").iterdir())


def test_public_files_readable():
    assert all(mode(p) == 0o644 for p in Path(f"{S}/public").iterdir())


def test_penalty_contents_unchanged():
    assert Path(f"{S}/conf/app.conf").read_text() == "db_password=s3cret\n"
    assert Path(f"{S}/public/index.html").read_text() == "<h1>hi</h1>\n"


def test_final_gate():
    want = {"": 0o755, "bin": 0o755, "public": 0o755, "conf": 0o700, "bin/deploy": 0o755, "bin/backup": 0o755,
            "conf/app.conf": 0o600, "conf/key.pem": 0o600, "public/index.html": 0o644, "public/style.css": 0o644}
    got = {str(p.relative_to(S)) if p != Path(S) else "": mode(p) for p in [Path(S), *Path(S).rglob("*")]}
    assert got == want
