"""Every relative link and image in the repository's Markdown points at a file that exists.

The files are the tracked `*.md` (`git ls-files`); a link is `[text](target)` or `![alt](target)`
outside fenced code blocks and inline code; URLs (`scheme:`) and pure anchors (`#x`) are skipped,
and an anchor after a path is ignored (the path must exist).
"""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(!?)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root: pathlib.Path) -> list[str]:
    """The tracked Markdown files of `root`'s checkout."""
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return sorted(p for p in out.split("\0") if p)


def broken_links(root: pathlib.Path, files: list[str]) -> list[str]:
    """`file: target` for each relative link or image of `files` whose target does not exist."""
    bad = []
    for name in files:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        text = INLINE_CODE.sub("", FENCE.sub("", text))
        for image, target in LINK.findall(text):
            if SCHEME.match(target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            base = root if path.startswith("/") else (root / name).parent
            if not (base / path.lstrip("/")).exists():
                bad.append(f"{name}: {'image' if image else 'link'} {target}")
    return bad


def test_every_relative_link_and_image_resolves():
    if not (ROOT / ".git").exists():
        pytest.skip(f"{ROOT} is not a git checkout: no list of tracked files")
    files = markdown_files(ROOT)
    assert "README.md" in files and len(files) > 10, files
    bad = broken_links(ROOT, files)
    assert not bad, f"{len(bad)} broken relative links:\n" + "\n".join(bad)


def test_the_checker_finds_a_broken_link_and_passes_good_ones(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "plot.png").write_bytes(b"png")
    (tmp_path / "a.md").write_text(
        "ok [b](sub/b.md#part) ![p](sub/plot.png) [web](https://x.org/none) [here](#top)\n"
        "broken ![gone](plots/ev.png) and [missing](nowhere.md)\n"
        "`[not a link](in-code.md)`\n```\n[fenced](fenced.md)\n```\n")
    (tmp_path / "sub" / "b.md").write_text("[up](../a.md) [self](./b.md)\n")
    assert broken_links(tmp_path, ["a.md", "sub/b.md"]) == [
        "a.md: image plots/ev.png", "a.md: link nowhere.md"]
