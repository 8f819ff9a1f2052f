import os
import stat
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)

import configparser
import re

ORIGINAL = '; Application configuration\n; managed by hand - keep comments\n[server]\nhost = 0.0.0.0\nport = 8080\n; workers = 2\n\n[database]\nhost = localhost\nport = 5432\nname = shop\n; pool size tuned in 2023\npool = 10\n\n[cache]\nenabled = true\nttl = 300\n'


def parsed():
    cp = configparser.ConfigParser(strict=True, comment_prefixes=(";",))
    cp.read_string(Path("/app/config/app.ini").read_text())
    return cp


def test_database_updated():
    cp = parsed()
    assert (cp["database"]["host"], cp["database"]["port"]) == ("db.internal", "5433")
    assert (cp["database"]["name"], cp["database"]["pool"]) == ("shop", "10")


def test_cache_disabled():
    cp = parsed()
    assert cp["cache"]["enabled"] == "false" and cp["cache"]["ttl"] == "300"


def test_metrics_section_added_last():
    cp = parsed()
    assert cp.sections()[-1] == "metrics"
    assert dict(cp["metrics"]) == {"enabled": "true", "port": "9100"}


def test_final_gate():
    cp = parsed()
    assert cp.sections() == ["server", "database", "cache", "metrics"]
    assert dict(cp["server"]) == {"host": "0.0.0.0", "port": "8080"}
    assert dict(cp["database"]) == {"host": "db.internal", "port": "5433", "name": "shop", "pool": "10"}
    assert dict(cp["cache"]) == {"enabled": "false", "ttl": "300"}
    text = Path("/app/config/app.ini").read_text()
    assert [l for l in text.splitlines() if l.startswith(";")] == [l for l in ORIGINAL.splitlines() if l.startswith(";")]
    want = ORIGINAL.replace("host = localhost", "host = db.internal").replace("port = 5432", "port = 5433").replace("enabled = true", "enabled = false")

    def norm(lines):
        return [re.sub(r"\s*=\s*", "=", l.strip()) for l in lines if l.strip()]

    got_lines, want_lines = norm(text.splitlines()), norm(want.splitlines())
    assert got_lines[:len(want_lines)] == want_lines
    assert got_lines[len(want_lines):] in (["[metrics]", "enabled=true", "port=9100"], ["[metrics]", "port=9100", "enabled=true"])
