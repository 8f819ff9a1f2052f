"""The gym's task families: each turns a seeded `random.Random` into one instance.

An instance is everything a task directory holds, as data: the instruction (one line, at most 300
bytes), the files of the initial state (relative to /app), the reference solution (1-4 commands,
one per turn), a partial attempt (lands strictly between nothing and the reference), plausible
wrong first actions (`mistakes`), state-independent `repair` commands (reach the goal from the
initial state or from any state a mistake leaves: the embedded teacher) and the check file.

Checks (one Python file, run by pytest or the stdlib check runner, the same semantics): at least
three behavioural scenario checks plus `test_final_gate`; `test_penalty_*` checks guard inputs a
mistake destroys (they pass on the initial state, so a no-op scores P = 0 exactly).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Callable, Mapping

WORDS = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "indigo", "jasper",
    "kelp", "lotus", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "sable", "tundra",
    "umber", "violet", "willow", "xenon", "yarrow", "zephyr", "basil", "comet", "dune", "fern",
    "glacier", "hazel", "iris", "juniper", "lichen", "meadow", "nova", "orchid", "pine", "reef",
)
DIRS = ("out", "docs", "notes", "reports", "drafts", "results", "cache", "stash")
EXTS = ("txt", "csv", "md")


@dataclass(frozen=True)
class Instance:
    """One generated task, as data (see the module doc)."""

    instruction: str
    files: Mapping[str, str]
    solution: tuple[str, ...]
    partial: tuple[str, ...]
    mistakes: tuple[str, ...]
    repair: tuple[str, ...]
    checks: str                        # the body of the check file (constants are prepended)
    constants: Mapping[str, object] = field(default_factory=dict)

    def test_source(self) -> str:
        """The check file: stdlib only, constants as JSON literals, then the checks."""
        head = ['"""Checks of one gym instance (generated; stdlib only)."""', "import json",
                "import os", "from pathlib import Path", ""]
        for name, value in sorted(self.constants.items()):
            head.append(f"{name} = json.loads({json.dumps(json.dumps(value, sort_keys=True))})")
        return "\n".join(head) + "\n\n" + self.checks.strip() + "\n"


@dataclass(frozen=True)
class Family:
    """A task family: its name, tier, whether it needs an observation before acting (`observes`),
    whether a plausible wrong first action has to be undone (`undo`), and its generator."""

    name: str
    tier: str
    observes: bool
    undo: bool
    generate: Callable[[random.Random], Instance]
    summary: str = ""


def _words(rng: random.Random, n: int) -> list[str]:
    return rng.sample(WORDS, n)


def _line(rng: random.Random) -> str:
    return f"{rng.choice(WORDS)} {rng.randint(100, 999)} {rng.choice(WORDS)}"


# ---------------------------------------------------------------- easy


def write_file(rng: random.Random) -> Instance:
    d, (name, word) = rng.choice(DIRS), _words(rng, 2)
    word = f"{word}{rng.randint(10, 99)}"
    path = f"{d}/{name}.txt"
    return Instance(
        instruction=f"Create the file /app/{path} containing the single line {word}",
        files={"README": "scratch space\n"},
        solution=(f"mkdir -p /app/{d} && echo {word} > /app/{path}",),
        partial=(f"mkdir -p /app/{d}",),
        mistakes=(f"echo {word} > {name}.txt",),
        repair=(f"mkdir -p /app/{d} && echo {word} > /app/{path}",),
        constants={"PATH": f"/app/{path}", "WORD": word},
        checks='''
def test_dir_exists():
    assert Path(PATH).parent.is_dir()


def test_file_exists():
    assert Path(PATH).is_file()


def test_content():
    assert Path(PATH).read_text().strip() == WORD


def test_final_gate():
    assert Path(PATH).read_text() == WORD + "\\n"
''')


def copy_keep(rng: random.Random) -> Instance:
    a, b = _words(rng, 2)
    content = "\n".join(_line(rng) for _ in range(rng.randint(2, 4))) + "\n"
    src, dst = f"data/{a}.txt", f"backup/{a}.bak"
    return Instance(
        instruction=f"Copy /app/{src} to /app/{dst} and keep the original file where it is.",
        files={src: content, f"data/{b}.txt": _line(rng) + "\n"},
        solution=(f"mkdir -p /app/backup && cp /app/{src} /app/{dst}",),
        partial=("mkdir -p /app/backup",),
        mistakes=(f"mkdir -p /app/backup && mv /app/{src} /app/{dst}",),
        repair=(f"mkdir -p /app/backup && (test -f /app/{src} || cp /app/{dst} /app/{src})",
                f"cp /app/{src} /app/{dst}"),
        constants={"SRC": f"/app/{src}", "DST": f"/app/{dst}", "CONTENT": content},
        checks='''
def test_backup_dir():
    assert Path(DST).parent.is_dir()


def test_backup_exists():
    assert Path(DST).is_file()


def test_backup_content():
    assert Path(DST).read_text() == CONTENT


def test_final_gate():
    assert Path(DST).read_text() == CONTENT and Path(SRC).read_text() == CONTENT


def test_penalty_original_kept():
    assert Path(SRC).is_file() and Path(SRC).read_text() == CONTENT
''')


# ---------------------------------------------------------------- medium


def move_logs(rng: random.Random) -> Instance:
    names = _words(rng, rng.randint(4, 5))
    n_logs = rng.randint(2, len(names) - 2)
    ext = rng.choice(EXTS)
    logs = {f"{n}.log": _line(rng) + "\n" for n in names[:n_logs]}
    others = {f"{n}.{ext}": _line(rng) + "\n" for n in names[n_logs:]}
    first = sorted(logs)[0]
    return Instance(
        instruction="Move every .log file from /app/in to /app/logs. The other files must stay "
                    "in /app/in.",
        files={**{f"in/{k}": v for k, v in logs.items()}, **{f"in/{k}": v for k, v in others.items()}},
        solution=("mkdir -p logs && mv in/*.log logs/",),
        partial=(f"mkdir -p logs && mv in/{first} logs/",),
        mistakes=("mkdir -p logs && mv in/* logs/",),
        repair=(f"mkdir -p logs && mv logs/*.{ext} in/ 2>/dev/null; mv in/*.log logs/ 2>/dev/null; "
                "ls in logs",),
        constants={"LOGS": logs, "OTHERS": others},
        checks='''
IN, OUT = Path("/app/in"), Path("/app/logs")


def test_logs_dir():
    assert OUT.is_dir()


def test_some_log_moved():
    assert any((OUT / n).is_file() and not (IN / n).exists() for n in LOGS)


def test_all_logs_moved():
    assert all((OUT / n).read_text() == c and not (IN / n).exists() for n, c in LOGS.items())


def test_final_gate():
    assert sorted(os.listdir(OUT)) == sorted(LOGS)
    assert all((OUT / n).read_text() == c for n, c in LOGS.items())
    assert sorted(os.listdir(IN)) == sorted(OTHERS)


def test_penalty_others_kept():
    assert all((IN / n).is_file() and (IN / n).read_text() == c for n, c in OTHERS.items())
''')


def follow_pointer(rng: random.Random) -> Instance:
    names = _words(rng, rng.randint(4, 5))
    store = {n: _line(rng) + "\n" for n in names}
    target, wrong = rng.sample(names, 2)
    return Instance(
        instruction="/app/next.txt holds the name of a file in /app/store. Copy that file to "
                    "/app/found.txt.",
        files={"next.txt": target + "\n", **{f"store/{n}": c for n, c in store.items()}},
        solution=("cat /app/next.txt", f"cp /app/store/{target} /app/found.txt"),
        partial=("cat /app/next.txt", f"cp /app/store/{wrong} /app/found.txt"),
        mistakes=("cp /app/next.txt /app/found.txt",),
        repair=("cat /app/next.txt", f"cp /app/store/{target} /app/found.txt"),
        constants={"STORE": store, "TARGET": target},
        checks='''
FOUND = Path("/app/found.txt")


def test_found_exists():
    assert FOUND.is_file()


def test_found_from_store():
    assert FOUND.read_text() in STORE.values()


def test_found_is_target():
    assert FOUND.read_text() == STORE[TARGET]


def test_final_gate():
    assert FOUND.read_text() == STORE[TARGET]
    assert all(Path("/app/store", n).read_text() == c for n, c in STORE.items())
''')


def uid_lookup(rng: random.Random) -> Instance:
    names = _words(rng, rng.randint(4, 6))
    uids = rng.sample(range(1000, 9999), len(names))
    users = dict(zip(names, uids))
    name, other = rng.sample(names, 2)
    return Instance(
        instruction=f"/app/users.txt lists users as name:uid. Write the uid of {name} to /app/uid.txt.",
        files={"users.txt": "".join(f"{n}:{u}\n" for n, u in users.items())},
        solution=(f"grep {name}: users.txt", f"echo {users[name]} > uid.txt"),
        partial=(f"grep {name}: users.txt", f"echo {users[other]} > uid.txt"),
        mistakes=(f"grep {name}: users.txt > uid.txt",),
        repair=(f"grep {name}: users.txt", f"echo {users[name]} > uid.txt"),
        constants={"UID": users[name], "USERS": "".join(f"{n}:{u}\n" for n, u in users.items())},
        checks='''
OUT = Path("/app/uid.txt")


def test_uid_file_exists():
    assert OUT.is_file()


def test_uid_is_number():
    assert OUT.read_text().strip().isdigit()


def test_uid_is_right():
    assert int(OUT.read_text().strip()) == UID


def test_final_gate():
    assert OUT.read_text().strip() == str(UID)
    assert Path("/app/users.txt").read_text() == USERS
''')


# ---------------------------------------------------------------- hard


def find_max(rng: random.Random) -> Instance:
    names = _words(rng, rng.randint(4, 5))
    values = rng.sample(range(10, 999), len(names))
    scores = {f"{n}.txt": f"{v}\n" for n, v in zip(names, values)}
    top = max(scores, key=lambda k: int(scores[k]))
    other = rng.choice([k for k in scores if k != top])
    return Instance(
        instruction="Each file in /app/scores holds one number. Copy the file with the largest "
                    "number into /app/best/ (same file name).",
        files={f"scores/{k}": v for k, v in scores.items()},
        solution=("grep . scores/*", f"mkdir -p best && cp scores/{top} best/"),
        partial=("grep . scores/*", f"mkdir -p best && cp scores/{other} best/"),
        mistakes=("mkdir -p best && cp scores/* best/",),
        repair=("grep . scores/*", f"rm -rf best; mkdir best && cp scores/{top} best/"),
        constants={"SCORES": scores, "TOP": top},
        checks='''
BEST = Path("/app/best")


def test_best_dir():
    assert BEST.is_dir()


def test_best_holds_a_score_file():
    assert any((BEST / n).is_file() and (BEST / n).read_text() == c for n, c in SCORES.items())


def test_best_holds_the_max():
    assert (BEST / TOP).read_text() == SCORES[TOP]


def test_final_gate():
    assert os.listdir(BEST) == [TOP] and (BEST / TOP).read_text() == SCORES[TOP]
    assert all(Path("/app/scores", n).read_text() == c for n, c in SCORES.items())
''')


def sum_column(rng: random.Random) -> Instance:
    cols = _words(rng, 3)
    rows = [[rng.randint(1, 60) for _ in cols] for _ in range(rng.randint(4, 6))]
    i, j = rng.sample(range(3), 2)
    text = ",".join(cols) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)
    total, wrong = sum(r[i] for r in rows), sum(r[j] for r in rows)
    awk = "awk -F, 'NR>1{{s+=${}}} END{{print s}}' data.csv > total.txt"
    return Instance(
        instruction=f"/app/data.csv has a header line. Write the sum of its column {cols[i]} to "
                    "/app/total.txt.",
        files={"data.csv": text},
        solution=("head -1 data.csv", awk.format(i + 1)),
        partial=("head -1 data.csv", awk.format(j + 1)),
        mistakes=(f"cut -d, -f{i + 1} data.csv > total.txt",),
        repair=("head -1 data.csv", awk.format(i + 1)),
        constants={"TOTAL": total, "WRONG": wrong, "CSV": text},
        checks='''
OUT = Path("/app/total.txt")


def test_total_exists():
    assert OUT.is_file()


def test_total_is_number():
    assert OUT.read_text().strip().isdigit()


def test_total_is_right():
    assert int(OUT.read_text().strip()) == TOTAL


def test_final_gate():
    assert OUT.read_text().strip() == str(TOTAL)
    assert Path("/app/data.csv").read_text() == CSV
''')


# ---------------------------------------------------------------- extreme


def restore_latest(rng: random.Random) -> Instance:
    numbers = sorted(rng.sample(range(2, 30), 3))
    snaps = {f"notes.{n}": _line(rng) + "\n" for n in numbers}
    newest = f"notes.{numbers[-1]}"
    older = rng.choice([k for k in snaps if k != newest])
    original = _line(rng) + "\n"
    return Instance(
        instruction="/app/snap holds numbered copies notes.N of /app/notes.txt. Replace "
                    "/app/notes.txt with the copy whose N is highest, then make it read-only "
                    "(mode 444).",
        files={"notes.txt": original, **{f"snap/{k}": v for k, v in snaps.items()}},
        solution=("ls snap", f"cp -f snap/{newest} notes.txt && chmod 444 notes.txt"),
        partial=("ls snap", f"cp -f snap/{older} notes.txt"),
        mistakes=(f"mv snap/{newest} notes.txt",),
        repair=("ls snap", f"test -f snap/{newest} || cp notes.txt snap/{newest}",
                f"cp -f snap/{newest} notes.txt && chmod 444 notes.txt"),
        constants={"SNAPS": snaps, "NEWEST": newest, "ORIGINAL": original},
        checks='''
NOTES = Path("/app/notes.txt")


def test_notes_changed():
    assert NOTES.read_text() != ORIGINAL


def test_notes_from_a_snapshot():
    assert NOTES.read_text() in SNAPS.values()


def test_notes_is_newest():
    assert NOTES.read_text() == SNAPS[NEWEST]


def test_notes_read_only():
    assert NOTES.stat().st_mode & 0o777 == 0o444


def test_final_gate():
    assert NOTES.read_text() == SNAPS[NEWEST] and NOTES.stat().st_mode & 0o777 == 0o444


def test_penalty_snapshots_kept():
    assert all(Path("/app/snap", n).read_text() == c for n, c in SNAPS.items())
''')


FAMILY_LIST = (
    Family("write-file", "easy", False, False, write_file, "create a file with given content"),
    Family("copy-keep", "easy", False, True, copy_keep, "copy a file, keep the original"),
    Family("move-logs", "medium", False, True, move_logs, "move files by extension"),
    Family("follow-pointer", "medium", True, False, follow_pointer, "read a name, copy that file"),
    Family("uid-lookup", "medium", True, False, uid_lookup, "look a value up, write it"),
    Family("find-max", "hard", True, False, find_max, "read numbers, copy the largest's file"),
    Family("sum-column", "hard", True, False, sum_column, "read a header, sum a column"),
    Family("restore-latest", "extreme", True, True, restore_latest,
           "read snapshot names, restore the newest, chmod"),
)
