from pathlib import Path

NAMES = ['Alice', ' bob', 'CAROL ', 'alice', 'Dave', '', 'bob', '  Eve  ', 'carol', 'Mallory', 'dave ', '', 'Trent', 'eve', 'Zoe', 'oscar', 'Oscar', ' Peggy', 'ALICE', 'victor']
EXPECTED = sorted({n.strip().lower() for n in NAMES if n.strip()})
OUT = Path("/app/unique.txt")


def lines():
    assert OUT.is_file(), "/app/unique.txt was not written"
    text = OUT.read_text()
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def test_lines_lowercase_and_trimmed():
    got = lines()
    assert len(got) >= 5
    assert all(line and line == line.strip().lower() for line in got), got


def test_no_duplicates():
    got = lines()
    assert len(got) >= 5
    assert len(got) == len({line.strip().lower() for line in got}), "duplicate names (ignoring case/space)"


def test_sorted_bytewise():
    got = lines()
    assert len(got) >= 5 and got == sorted(got, key=lambda s: s.encode())


def test_same_set_of_names():
    assert set(lines()) == set(EXPECTED)


def test_penalty_input_kept():
    assert Path("/app/names.txt").read_text() == "\n".join(NAMES) + "\n"


def test_final_gate():
    assert OUT.read_text() == "\n".join(EXPECTED) + "\n"
