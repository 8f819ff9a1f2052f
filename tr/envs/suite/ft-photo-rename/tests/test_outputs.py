import re
from pathlib import Path

PHOTOS = Path("/app/photos")
NUMBERS = ["0001", "0002", "0003", "0004", "0005", "0017", "0042"]
OTHERS = {"notes.txt": "remember to back up\n", "IMG_0006.txt": "not a picture\n", "IMG 0007.png": "raw data\n"}


def renamed():
    return sorted(p.name for p in PHOTOS.iterdir() if re.fullmatch(r"photo_\d{4}\.jpg", p.name))


def test_all_new_names_present():
    assert renamed() == sorted(f"photo_{n}.jpg" for n in NUMBERS)


def test_renamed_files_keep_their_content():
    names = renamed()
    assert names, "no photo_NNNN.jpg file found"
    for name in names:
        num = name[6:10]
        assert (PHOTOS / name).read_text() == f"JPEGDATA-{num}\n", name


def test_no_picture_left_under_old_name():
    assert renamed(), "no photo_NNNN.jpg file found"
    leftovers = [p.name for p in PHOTOS.iterdir() if p.is_file() and re.search(r"\.jpe?g$", p.name, re.I)
                 and not re.fullmatch(r"photo_\d{4}\.jpg", p.name)]
    assert leftovers == []


def test_penalty_other_files_untouched():
    for name, text in OTHERS.items():
        assert (PHOTOS / name).read_text() == text, name
    assert (PHOTOS / "archive" / "IMG_0099.JPG").read_text() == "JPEGDATA-0099\n"


def test_final_gate():
    expected = {f"photo_{n}.jpg" for n in NUMBERS} | set(OTHERS) | {"archive"}
    assert {p.name for p in PHOTOS.iterdir()} == expected
    assert [p.name for p in (PHOTOS / "archive").iterdir()] == ["IMG_0099.JPG"]
    for n in NUMBERS:
        assert (PHOTOS / f"photo_{n}.jpg").read_text() == f"JPEGDATA-{n}\n"
