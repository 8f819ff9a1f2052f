from pathlib import Path

PASSWD, GROUP, SHADOW = 'root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\nolduser:x:1001:1001:Former Employee,,,:/home/olduser:/bin/bash\nsvc:x:1002:1002:Service account:/srv/svc:/bin/bash\nalice:x:1003:1003:Alice,,,:/home/alice:/bin/bash\n', 'root:x:0:\ndaemon:x:1:\nwww-data:x:33:alice\ndocker:x:999:alice\nolduser:x:1001:\nsvc:x:1002:\nalice:x:1003:\n', 'root:*:19700:0:99999:7:::\ndaemon:*:19700:0:99999:7:::\nwww-data:*:19700:0:99999:7:::\nolduser:$6$abc$hashedpasswordvalue:19701:0:99999:7:::\nsvc:$6$def$anotherhashvalue:19702:0:99999:7:::\nalice:$6$ghi$alicehashvalue:19703:0:99999:7:::\n'


def table(name, fields):
    rows = [l.split(":") for l in Path("/app/etc", name).read_text().splitlines() if l.strip()]
    assert all(len(r) == fields for r in rows), name
    return rows


def by_name(rows):
    return {r[0]: r for r in rows}


def orig(text):
    return {l.split(":")[0]: l.split(":") for l in text.splitlines()}


def test_deploy_user_and_group():
    p, g = by_name(table("passwd", 7)), by_name(table("group", 4))
    assert p.get("deploy") == ["deploy", "x", "1500", "1500", "Deploy bot", "/home/deploy", "/bin/bash"]
    assert g.get("deploy", [None] * 3)[:3] == ["deploy", "x", "1500"]
    s = by_name(table("shadow", 9)).get("deploy")
    assert s is not None and s[1] in ("!", "!*", "*")


def test_deploy_in_supplementary_groups():
    g = by_name(table("group", 4))
    for name in ("docker", "www-data"):
        members = g[name][3].split(",")
        assert "deploy" in members and "alice" in members, g[name]


def test_olduser_locked():
    s = by_name(table("shadow", 9))["olduser"]
    assert s[1] == "!" + orig(SHADOW)["olduser"][1] and s[2:] == orig(SHADOW)["olduser"][2:]
    assert by_name(table("passwd", 7))["olduser"] == orig(PASSWD)["olduser"]


def test_svc_nologin():
    p = by_name(table("passwd", 7))["svc"]
    assert p[6] == "/usr/sbin/nologin" and p[:6] == orig(PASSWD)["svc"][:6]


def test_final_gate():
    p, g, s = table("passwd", 7), table("group", 4), table("shadow", 9)
    for rows, idx in ((p, 0), (p, 2), (g, 0), (g, 2), (s, 0)):
        col = [r[idx] for r in rows]
        assert len(col) == len(set(col)), col
    want_p = orig(PASSWD)
    want_p["svc"] = want_p["svc"][:6] + ["/usr/sbin/nologin"]
    want_p["deploy"] = ["deploy", "x", "1500", "1500", "Deploy bot", "/home/deploy", "/bin/bash"]
    assert by_name(p) == want_p
    want_g = orig(GROUP)
    assert {k: v for k, v in by_name(g).items() if k not in ("docker", "www-data", "deploy")} == {k: v for k, v in want_g.items() if k not in ("docker", "www-data")}
    assert sorted(by_name(g)["docker"][3].split(",")) == ["alice", "deploy"]
    assert sorted(by_name(g)["www-data"][3].split(",")) == ["alice", "deploy"]
    assert by_name(g)["deploy"][3] in ("", "deploy")
    shadow = by_name(s)
    assert {k: v for k, v in shadow.items() if k not in ("olduser", "deploy")} == {k: v for k, v in orig(SHADOW).items() if k != "olduser"}
    test_olduser_locked()
    test_deploy_user_and_group()
