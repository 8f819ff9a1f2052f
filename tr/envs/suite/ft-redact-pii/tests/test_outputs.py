import csv
import re
from pathlib import Path

DOCS = {'docs/readme.md': '# Service notes\nContact ops@example.com or admin.team@corp.example.org for access.\nThe primary host is 10.0.0.15 and the backup is 192.168.1.200.\nVersion 2.4.1 is deployed.\n', 'docs/incidents/2024-03.txt': '03-02 outage on 172.16.5.4, reported by jane.doe+alerts@example.net\n03-09 no incident\n03-15 DNS 8.8.8.8 unreachable from 10.0.0.15; mail sent to noc@example.com and ops@example.com\n', 'docs/incidents/2024-04.txt': '04-01 all quiet\n04-20 patch 1.2.3 rolled out\n', 'docs/team/contacts.md': '| name | mail |\n|---|---|\n| Ann | ann_smith@example.co.uk |\n| Bo | bo-92@mail.example.com |\n', 'docs/legal/notice.txt': 'Send complaints to legal@example.com. Registered office server 203.0.113.9.\n'}
EMAIL = re.compile('[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}')
IP = re.compile('\\b(?:\\d{1,3}\\.){3}\\d{1,3}\\b')


def expected(text):
    return IP.sub("[IP]", EMAIL.sub("[EMAIL]", text))


def public_files():
    return {p: t for p, t in DOCS.items() if not p.startswith("docs/legal/")}


def test_no_email_addresses_left():
    seen = 0
    for path in public_files():
        text = Path("/app", path).read_text()
        assert not EMAIL.search(text), path
        seen += text.count("[EMAIL]")
    assert seen == sum(len(EMAIL.findall(t)) for t in public_files().values())


def test_no_ip_addresses_left():
    seen = 0
    for path in public_files():
        text = Path("/app", path).read_text()
        assert not IP.search(text), path
        seen += text.count("[IP]")
    assert seen == sum(len(IP.findall(t)) for t in public_files().values())


def test_report():
    with open("/app/redaction_report.csv", newline="") as f:
        rows = list(csv.reader(f))
    want = [["path", "emails", "ips"]]
    for path, text in sorted(public_files().items()):
        e, i = len(EMAIL.findall(text)), len(IP.findall(text))
        if e + i:
            want.append([path[len("docs/"):], str(e), str(i)])
    assert rows == want


def test_penalty_legal_untouched():
    assert Path("/app/docs/legal/notice.txt").read_text() == DOCS["docs/legal/notice.txt"]


def test_final_gate():
    test_report()
    files = sorted(str(p.relative_to("/app")) for p in Path("/app/docs").rglob("*") if p.is_file())
    assert files == sorted(DOCS)
    for path, text in DOCS.items():
        want = text if path.startswith("docs/legal/") else expected(text)
        assert Path("/app", path).read_text() == want, path
