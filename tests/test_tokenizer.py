"""Byte tokenizer and the Hugging Face tokenizer.json loader (a tokenizer trained here, offline)."""

import json

import pytest
from tokenizers import Tokenizer as HFLibTokenizer, decoders, models, pre_tokenizers, trainers

from tr.models.tokenizer import (IM_END, IM_START, ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer,
                                 tokenizer_fingerprint)

TEXTS = ["hello world", "ls -la /tmp && cat notes.txt", "héllo ✓ 漢字", "", "a\nb\tc"]


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory):
    tok = HFLibTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=350, special_tokens=["<|endoftext|>", IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["ls -la /tmp", "cat file.txt | grep foo", "hello world"] * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_byte_tokenizer_round_trips_utf8():
    tok = ByteTokenizer()
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text
    assert isinstance(tok, Tokenizer)


def test_byte_tokenizer_specials_are_ids_not_text():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.special_id("<|endoftext|>"), tok.special_id(IM_START), tok.eos_id) == (256, 257, 258, 259)
    assert tok.special_id(IM_END) == tok.eos_id
    assert all(i < 256 for i in tok.encode("x <|im_end|> y"))  # text never becomes a special token
    assert tok.decode([104, 105, tok.eos_id]) == "hi<|im_end|>"
    assert tok.decode([0xE2, 0x9C]) == "\ufffd"  # cut UTF-8 does not raise
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([600])
    with pytest.raises(KeyError, match="no special token '<bos>'"):
        tok.special_id("<bos>")
    with pytest.raises(ValueError, match="vocab_size=100"):
        ByteTokenizer(100)


def test_hf_tokenizer_round_trips_and_ignores_special_text(hf_path):
    tok = HFTokenizer(hf_path)
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    im_end = tok.special_id(IM_END)
    assert tok.eos_id == im_end and tok.pad_id == tok.special_id("<|endoftext|>")
    assert im_end not in tok.encode("done <|im_end|>")
    assert tok.decode([im_end]) == IM_END
    assert tok.vocab_size == HFLibTokenizer.from_file(str(hf_path)).get_vocab_size(with_added_tokens=True)
    assert load_tokenizer(str(hf_path.parent)).eos_id == im_end
    assert json.loads(tokenizer_fingerprint(tok))["kind"] == "HFTokenizer"


def test_hf_tokenizer_errors_name_the_file_and_token(tmp_path, hf_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        HFTokenizer(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot parse"):
        HFTokenizer(bad)
    with pytest.raises(ValueError, match="has no token '<eos>'"):
        HFTokenizer(hf_path, eos_token="<eos>")


def test_load_tokenizer_default_is_bytes():
    assert isinstance(load_tokenizer(None), ByteTokenizer)
    assert load_tokenizer("byte", vocab_size=300).vocab_size == 300


def test_a_pinned_tokenizer_refuses_a_changed_file(tmp_path, hf_path):
    import shutil

    from tr.models.tokenizer import pin_tokenizer

    path = tmp_path / "tok.json"
    shutil.copy(hf_path, path)
    spec = pin_tokenizer(str(path))
    assert spec.startswith(str(path)) and "#sha256=" in spec
    assert pin_tokenizer(spec) == spec and pin_tokenizer("byte") == "byte"
    assert load_tokenizer(spec).encode("ls -la") == load_tokenizer(str(path)).encode("ls -la")
    path.write_text(json.dumps({**json.loads(path.read_text()), "truncation": None}) + " ")
    with pytest.raises(ValueError, match=r"tok.json.*has sha256 .* the run recorded"):
        load_tokenizer(spec)
    load_tokenizer(str(path))          # unpinned: whatever the file is now
