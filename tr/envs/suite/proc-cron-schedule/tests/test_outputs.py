import datetime
from pathlib import Path

ORIGINAL = '# crontab for the app user\nMAILTO=ops@example.com\nSHELL=/bin/sh\n# m h dom mon dow command\n30 2 * * 0 /opt/app/bin/backup.sh\n0 6 * * 1-5 /opt/app/bin/report.sh\n15 * * * * /opt/app/bin/rotate.sh\n0 4 * 1 * /opt/app/bin/cleanup.sh\n5 8-20 * * * /opt/app/bin/sync.sh\n'
NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6,
         "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}
START = datetime.datetime(2024, 1, 26, 0, 0)
MINUTES = [START + datetime.timedelta(minutes=i) for i in range(60 * 24 * 10)]


def field(spec, lo, hi):
    out = set()
    for part in spec.lower().split(","):
        rng, _, step = part.partition("/")
        step = int(step) if step else 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (int(NAMES.get(x, x)) for x in rng.split("-"))
        else:
            a = int(NAMES.get(rng, rng))
            b = hi if step > 1 else a
        out |= set(range(a, b + 1, step))
    return out, spec == "*"


def jobs():
    out = {}
    for line in Path("/app/crontab").read_text().splitlines():
        s = line.strip()
        if not s or s.startswith("#") or "=" in s.split()[0]:
            continue
        parts = s.split(None, 5)
        assert len(parts) == 6, line
        out.setdefault(parts[5], []).append(parts[:5])
    return out


def runs(command):
    specs = jobs().get(command)
    assert specs and len(specs) == 1, command
    m, h, dom, mon, dow = specs[0]
    mins, hours, months = field(m, 0, 59)[0], field(h, 0, 23)[0], field(mon, 1, 12)[0]
    doms, dom_star = field(dom, 1, 31)
    dows, dow_star = field(dow, 0, 7)
    dows = {d % 7 for d in dows}
    out = []
    for t in MINUTES:
        day_dom, day_dow = t.day in doms, (t.isoweekday() % 7) in dows
        day = (day_dom and day_dow) if (dom_star or dow_star) else (day_dom or day_dow)
        if t.minute in mins and t.hour in hours and t.month in months and day:
            out.append(t)
    return out


def want(pred):
    return [t for t in MINUTES if pred(t)]


def test_backup_daily():
    assert runs("/opt/app/bin/backup.sh") == want(lambda t: (t.hour, t.minute) == (2, 30))


def test_report_weekdays():
    assert runs("/opt/app/bin/report.sh") == want(lambda t: (t.hour, t.minute) == (18, 0) and t.isoweekday() <= 5)


def test_rotate_every_15_minutes():
    assert runs("/opt/app/bin/rotate.sh") == want(lambda t: t.minute % 15 == 0)


def test_cleanup_monthly():
    assert runs("/opt/app/bin/cleanup.sh") == want(lambda t: (t.day, t.hour, t.minute) == (1, 4, 0))


def test_sync_every_two_hours():
    assert runs("/opt/app/bin/sync.sh") == want(lambda t: t.minute == 5 and t.hour in (8, 10, 12, 14, 16, 18, 20))


def test_final_gate():
    assert sorted(jobs()) == sorted(l.split(None, 5)[5] for l in ORIGINAL.splitlines() if l[:1].isdigit())
    keep = [l for l in ORIGINAL.splitlines() if l.startswith("#") or "=" in l.split()[0]]
    assert [l for l in Path("/app/crontab").read_text().splitlines() if l.startswith("#") or (l.split() and "=" in l.split()[0])] == keep
    for t in (test_backup_daily, test_report_weekdays, test_rotate_every_15_minutes, test_cleanup_monthly, test_sync_every_two_hours):
        t()
