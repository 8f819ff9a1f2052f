import re
from pathlib import Path

CH = Path("/app/chapters")


def expected_chapters():
    chapters, current = [], None
    for line in Path("/app/book.txt").read_text().splitlines(keepends=True):
        m = re.match(r"CHAPTER (\d+): (.*)$", line.rstrip("\n"))
        if m:
            current = [int(m.group(1)), m.group(2), []]
            chapters.append(current)
        if current is not None:
            current[2].append(line)
    assert len(chapters) == 7
    return [(n, title, "".join(lines)) for n, title, lines in chapters]


def read_index():
    path = CH / "index.tsv"
    assert path.is_file(), "index.tsv missing"
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    assert rows[0] == ["number", "title", "words"], rows[0]
    return rows[1:]


def test_one_file_per_chapter():
    names = sorted(p.name for p in CH.glob("*.txt"))
    assert names == [f"{n:02d}.txt" for n, _, _ in expected_chapters()]


def test_chapter_files_hold_exact_text():
    chapters = expected_chapters()
    assert all((CH / f"{n:02d}.txt").is_file() for n, _, _ in chapters)
    for n, _, text in chapters:
        assert (CH / f"{n:02d}.txt").read_text() == text, n


def test_index_numbers_and_titles():
    rows = read_index()
    assert [(int(r[0]), r[1]) for r in rows] == [(n, t) for n, t, _ in expected_chapters()]


def test_index_word_counts():
    rows = read_index()
    assert [int(r[2]) for r in rows] == [len(text.split()) for _, _, text in expected_chapters()]


def test_final_gate():
    chapters = expected_chapters()
    assert sorted(p.name for p in CH.iterdir()) == sorted([f"{n:02d}.txt" for n, _, _ in chapters] + ["index.tsv"])
    for n, _, text in chapters:
        assert (CH / f"{n:02d}.txt").read_text() == text
    assert read_index() == [[str(n), t, str(len(text.split()))] for n, t, text in chapters]
