import os
import stat
import subprocess
from pathlib import Path

os.environ.pop("PYTHONSAFEPATH", None)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)

import glob

ORIGINAL = '# This is the sshd server system-wide configuration file.\nInclude /etc/ssh/sshd_config.d/*.conf\n\nPort 22\n#AddressFamily any\nListenAddress 0.0.0.0\n\n#PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication yes\n#PermitEmptyPasswords no\n\nKbdInteractiveAuthentication no\nUsePAM yes\n\nX11Forwarding yes\nPrintMotd no\n\nAcceptEnv LANG LC_*\nSubsystem\tsftp\t/usr/lib/openssh/sftp-server\n\n# the backup robot may use a password, from the backup network only\nMatch User backup Address 10.0.5.0/24\n\tPasswordAuthentication yes\n\tForceCommand /usr/local/bin/backup-shell\n'
MAIN = "/app/etc/ssh/sshd_config"


def logical_lines(path):
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ") if " " in line else line.partition("\t")
        key, value = key.lower(), value.strip()
        if key == "include":
            for pattern in value.split():
                pattern = pattern.replace("/etc/ssh/", "/app/etc/ssh/", 1)
                for inc in sorted(glob.glob(pattern)):
                    yield from logical_lines(inc)
            continue
        yield key, value


def effective():
    out = {}
    for key, value in logical_lines(MAIN):
        if key == "match":
            break
        out.setdefault(key, value)
    return out


def match_block():
    lines = Path(MAIN).read_text().rstrip("\n").splitlines()
    starts = [i for i, l in enumerate(lines) if l.strip().lower().startswith("match ")]
    assert len(starts) == 1
    return lines[starts[0]:]


def test_port():
    assert effective().get("port") == "2222"


def test_root_login_disabled():
    assert effective().get("permitrootlogin") == "no"


def test_password_auth_disabled_globally():
    assert effective().get("passwordauthentication") == "no"


def test_allow_users_and_x11():
    eff = effective()
    assert sorted(eff.get("allowusers", "").split()) == ["admin", "backup", "deploy"]
    assert eff.get("x11forwarding") == "no"


def test_match_block_unchanged_and_last():
    assert effective().get("port") == "2222"
    want = ORIGINAL.rstrip("\n").splitlines()
    assert match_block() == want[want.index("Match User backup Address 10.0.5.0/24"):]


def test_final_gate():
    eff = effective()
    assert (eff.get("port"), eff.get("permitrootlogin"), eff.get("passwordauthentication"), eff.get("x11forwarding")) == ("2222", "no", "no", "no")
    assert sorted(eff["allowusers"].split()) == ["admin", "backup", "deploy"]
    assert eff.get("pubkeyauthentication") == "yes" and eff.get("usepam") == "yes"
    test_match_block_unchanged_and_last()
    text = Path(MAIN).read_text()
    assert "Include /etc/ssh/sshd_config.d/*.conf" in text
    keys = []
    for raw in text.split("\nMatch ")[0].splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keys.append(line.split()[0].lower())
    assert len(keys) == len(set(keys)), keys
