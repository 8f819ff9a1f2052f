from pathlib import Path

FILES = {'src/app/main.py': "import sys\r\nfrom app import util\r\n\r\ndef main():\r\n\tprint(util.greet(sys.argv[1] if len(sys.argv) > 1 else 'world'))   \r\n\r\nif __name__ == '__main__':\r\n\tmain()\r\n", 'src/app/util.py': "def greet(name):  \n\tif not name:\n\t\treturn 'hello'\t\n\treturn 'hello ' + name\n", 'src/app/__init__.py': '', 'src/tools/report.py': "ROWS = [\n\t('a', 1),  \n\t('b', 2),\n]\n\ndef total():\r\n\treturn sum(n for _, n in ROWS)\r\n", 'src/tools/clean.py': 'def clean(s):\n    return s.strip()\n', 'src/Makefile': 'run:\n\tpython3 -m app.main\n', 'src/notes.txt': 'keep\tthese\ttabs   \r\n'}


def normalized(text):
    text = text.replace("\r\n", "\n").replace("\t", "    ")
    return "\n".join(line.rstrip(" \t") for line in text.split("\n"))


def py_files():
    files = sorted(p for p in Path("/app/src").rglob("*.py"))
    assert len(files) == sum(k.endswith(".py") for k in FILES)
    return files


def test_no_crlf_in_python_files():
    for p in py_files():
        assert b"\r" not in p.read_bytes(), p


def test_no_tabs_in_python_files():
    for p in py_files():
        assert b"\t" not in p.read_bytes(), p


def test_no_trailing_whitespace():
    for p in py_files():
        for line in p.read_bytes().replace(b"\r\n", b"\n").split(b"\n"):
            assert line == line.rstrip(b" \t"), (p, line)


def test_penalty_other_files_untouched():
    for path, text in FILES.items():
        if not path.endswith(".py"):
            assert Path("/app", path).read_bytes() == text.encode(), path


def test_final_gate():
    for path, text in FILES.items():
        want = normalized(text) if path.endswith(".py") else text
        assert Path("/app", path).read_bytes() == want.encode(), path
