import shutil
import subprocess
from pathlib import Path

import pytest

SRC = "/app/wordfreq"
PRODUCTS = ('wordfreq', '*.o')


def fresh_copy(tmp_path):
    dst = tmp_path / "p"
    shutil.copytree(SRC, dst, symlinks=True, ignore=shutil.ignore_patterns(*PRODUCTS))
    return dst


def make(d, *args):
    return subprocess.run(["make", "-C", str(d), *args], capture_output=True, text=True, timeout=60)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, **kw)

import collections
import random
import re

MAKEFILE = 'CC = gcc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\n\nwordfreq: wordfreq.o counter.o\n\t$(CC) $(CFLAGS) -o $@ $^\n\n%.o: %.c counter.h\n\t$(CC) $(CFLAGS) -c $<\n\nclean:\n\trm -f wordfreq *.o\n\n.PHONY: clean\n'


def expected(text, n):
    counts = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))[:n]
    return "".join("%d %s\n" % (c, w) for w, c in top)


def build(tmp_path):
    d = fresh_copy(tmp_path)
    r = make(d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


def wf(d, n, text):
    return subprocess.run([str(d / "wordfreq"), str(n)], input=text, capture_output=True, text=True, timeout=20).stdout


def test_builds_with_werror(tmp_path):
    assert Path("/app/wordfreq/Makefile").read_text() == MAKEFILE
    d = build(tmp_path)
    assert (d / "wordfreq").is_file()


def test_counts_words(tmp_path):
    d = build(tmp_path)
    text = "Apple banana apple, APPLE! banana cherry"
    got = dict((w, int(c)) for c, w in (l.split() for l in wf(d, 10, text).splitlines()))
    assert got == {"apple": 3, "banana": 2, "cherry": 1}


def test_most_frequent_first_ties_alphabetical(tmp_path):
    d = build(tmp_path)
    text = "pear fig pear kiwi fig pear date kiwi fig"
    assert wf(d, 3, text) == expected(text, 3)


def test_no_warning_suppression():
    src = Path("/app/wordfreq/counter.c").read_text() + Path("/app/wordfreq/wordfreq.c").read_text()
    assert "#pragma" not in src and not re.search(r"\(void\)\s*[A-Za-z_(]", src)
    assert "#include <string.h>" in Path("/app/wordfreq/counter.c").read_text() or "string.h" in Path("/app/wordfreq/counter.h").read_text()


def test_final_gate(tmp_path):
    d = build(tmp_path)
    rng = random.Random(1)
    vocab = ["alpha", "Beta", "gamma", "delta", "Epsilon", "zeta", "eta", "theta"]
    text = " ".join(rng.choice(vocab) + rng.choice([" ", ", ", ".\n", "!? "]) for _ in range(3000))
    assert wf(d, 5, text) == expected(text, 5)
    assert wf(d, 100, text) == expected(text, 100)
    assert Path("/app/wordfreq/Makefile").read_text() == MAKEFILE
