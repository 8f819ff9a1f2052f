import re
import shlex
from pathlib import Path

UNIT = "/app/etc/systemd/system/webhook.service"


def parse():
    sections, current = {}, None
    for raw in Path(UNIT).read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        m = re.fullmatch(r"\[(.+)\]", line)
        if m:
            current = sections.setdefault(m.group(1), {})
            continue
        assert current is not None and "=" in line, line
        key, value = (s.strip() for s in line.split("=", 1))
        current.setdefault(key, []).append(value)
    return sections


def values(section, key):
    return [v for entry in parse().get(section, {}).get(key, []) for v in entry.split()]


def seconds(text):
    m = re.fullmatch(r"(\d+)\s*(s|sec)?", text)
    return int(m.group(1)) if m else None


def test_exec_start():
    assert [shlex.split(v) for v in parse().get("Service", {}).get("ExecStart", [])] == [["/opt/webhook/bin/webhook", "--port", "9000"]]


def test_user_directory_environment():
    svc = parse().get("Service", {})
    assert svc.get("User") == ["webhook"] and svc.get("Group") == ["webhook"]
    assert svc.get("WorkingDirectory") == ["/opt/webhook"]
    env = [a for v in svc.get("Environment", []) for a in shlex.split(v)]
    assert "LOG_LEVEL=info" in env and not [a for a in env if a.startswith("LOG_LEVEL=") and a != "LOG_LEVEL=info"]


def test_restart_policy():
    svc = parse().get("Service", {})
    assert svc.get("Restart") == ["on-failure"]
    assert [seconds(v) for v in svc.get("RestartSec", [])] == [3]


def test_ordering_and_install():
    assert "network-online.target" in values("Unit", "After")
    assert "network-online.target" in values("Unit", "Wants") + values("Unit", "Requires")
    assert values("Install", "WantedBy") == ["multi-user.target"]


def test_final_gate():
    sections = parse()
    assert sorted(sections) == ["Install", "Service", "Unit"]
    assert sections["Unit"]["Description"] == ["Webhook receiver"]
    single = {"Description", "ExecStart", "WorkingDirectory", "User", "Group", "Restart", "RestartSec", "Type"}
    for name, keys in sections.items():
        assert all(len(v) == 1 for k, v in keys.items() if k in single), (name, keys)
    test_exec_start()
    test_user_directory_environment()
    test_restart_policy()
    test_ordering_and_install()
