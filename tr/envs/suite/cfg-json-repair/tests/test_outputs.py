import os
import stat
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)

import json

WANT = {"name": "billing-api", "listen": "0.0.0.0:8443", "docs_url": "https://docs.example.com/billing",
        "workers": 8, "log_level": "info", "timeouts": {"read": 30, "write": 45, "idle": 120},
        "features": ["audit", "metrics"], "tls": {"enabled": True, "cert": "/etc/ssl/billing.pem"}}


def cfg():
    return json.loads(Path("/app/config/service.json").read_text())


def paths(d, prefix=""):
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict):
            out |= paths(v, prefix + k + ".")
    return out


def test_strict_json():
    data = cfg()
    assert isinstance(data, dict) and data


def test_settings_preserved():
    data = cfg()
    assert paths(data) == paths(WANT)
    for k in ("name", "listen", "docs_url", "features", "tls"):
        assert data[k] == WANT[k], k


def test_values_normalised():
    data = cfg()
    assert type(data["workers"]) is int and data["workers"] == 8
    assert data["log_level"] == "info"
    assert data["timeouts"] == {"read": 30, "write": 45, "idle": 120}
    assert all(type(v) is int for v in data["timeouts"].values())


def test_final_gate():
    assert cfg() == WANT
    r = subprocess.run(["python3", "/app/config/validate.py"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and r.stdout == ""
