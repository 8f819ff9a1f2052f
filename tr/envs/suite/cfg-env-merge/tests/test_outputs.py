import os
import stat
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)

WANT = {"APP_NAME": "shop", "DB_HOST": "db.prod.internal", "DB_PORT": "6543", "EMPTY_OK": "", "FEATURE_X": "on",
        "GREETING": "Hello there", "LOG_LEVEL": "error", "MOTTO": "ship it #fast", "SENTRY_DSN": "", "WORKERS": "2"}


def lines():
    return Path("/app/.env").read_text().splitlines()


def parse():
    out = {}
    for line in lines():
        key, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        out[key] = value
    return out


def test_all_keys_present():
    assert sorted(parse()) == sorted(WANT)


def test_precedence():
    got = parse()
    for key in ("DB_HOST", "DB_PORT", "LOG_LEVEL", "WORKERS", "FEATURE_X", "APP_NAME"):
        assert got.get(key) == WANT[key], key


def test_quoting():
    got = set(lines())
    assert {'GREETING="Hello there"', 'MOTTO="ship it #fast"', 'EMPTY_OK=""', 'SENTRY_DSN=""', "APP_NAME=shop"} <= got


def test_final_gate():
    want = ['%s="%s"' % (k, v) if (" " in v or "#" in v or v == "") else "%s=%s" % (k, v) for k, v in sorted(WANT.items())]
    assert lines() == want
    assert Path("/app/.env").read_text().endswith("\n")
