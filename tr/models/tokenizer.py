"""Tokenizers: a protocol, the byte-level default (no download) and a Hugging Face `tokenizer.json` loader.

Both encode plain text *without* interpreting special-token strings: an observation that contains
the text `<|im_end|>` stays ordinary bytes/tokens, so the environment can never forge a turn
boundary. Special tokens are obtained only by id (`special_id(name)`), which is how `chat.py`
builds the turn layout.
"""

from __future__ import annotations

import json
import os
from typing import Protocol, Sequence, runtime_checkable

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
PAD = "<|pad|>"
CHAT_SPECIALS: tuple[str, ...] = (IM_START, IM_END)


@runtime_checkable
class Tokenizer(Protocol):
    """What models, chat layout and sampler need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def special_id(self, name: str) -> int: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; special tokens follow; the vocabulary is padded to `vocab_size`.

    Specials: `<|pad|>`=256, `<|endoftext|>`=257, `<|im_start|>`=258, `<|im_end|>`=259.
    `eos_id` is `<|im_end|>` (the end of an assistant turn, where sampling stops).
    `decode` renders special ids by name and invalid UTF-8 with U+FFFD.
    """

    SPECIALS: tuple[str, ...] = (PAD, ENDOFTEXT, IM_START, IM_END)

    def __init__(self, vocab_size: int = 512):
        if vocab_size < 256 + len(self.SPECIALS):
            raise ValueError(f"ByteTokenizer: vocab_size={vocab_size} < {256 + len(self.SPECIALS)} "
                             "(256 bytes + special tokens)")
        self._vocab_size = vocab_size
        self._special_ids = {name: 256 + i for i, name in enumerate(self.SPECIALS)}
        self._special_names = {i: name for name, i in self._special_ids.items()}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_id(self) -> int:
        return self._special_ids[IM_END]

    @property
    def pad_id(self) -> int:
        return self._special_ids[PAD]

    def special_id(self, name: str) -> int:
        if name not in self._special_ids:
            raise KeyError(f"ByteTokenizer has no special token {name!r}; known: {list(self._special_ids)}")
        return self._special_ids[name]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                run.append(i)
                continue
            if run:
                parts.append(run.decode("utf-8", errors="replace"))
                run = bytearray()
            if i in self._special_names:
                parts.append(self._special_names[i])
            elif 0 <= i < self._vocab_size:
                parts.append("")  # reserved, unused ids decode to nothing
            else:
                raise ValueError(f"ByteTokenizer.decode: id {i} outside the vocabulary [0, {self._vocab_size})")
        if run:
            parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


class HFTokenizer:
    """A Hugging Face `tokenizer.json` (the `tokenizers` library), e.g. the one shipped with Qwen3.

    `eos_token` defaults to `<|im_end|>` and `pad_token` to `<|endoftext|>` (Qwen3's choices); both
    and the chat specials must exist in the file. `vocab_size` is the tokenizer's size including
    added tokens (a model's embedding may be larger, e.g. 151,936 for Qwen3).
    """

    def __init__(self, path: str | os.PathLike, *, eos_token: str = IM_END, pad_token: str = ENDOFTEXT,
                 required_specials: Sequence[str] = CHAT_SPECIALS):
        from tokenizers import Tokenizer as _HFTok  # the library is a hard dependency; imported here for speed

        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"HFTokenizer: no tokenizer.json at {path!r}")
        try:
            self._tok = _HFTok.from_file(path)
        except Exception as exc:  # the library raises a bare Exception with its parse message
            raise ValueError(f"HFTokenizer: cannot parse {path!r}: {exc}") from exc
        self._tok.encode_special_tokens = True  # special-token strings in text stay plain text
        self.path = path
        self._ids = {}
        for name in (eos_token, pad_token, *required_specials):
            token_id = self._tok.token_to_id(name)
            if token_id is None:
                raise ValueError(f"HFTokenizer: {path!r} has no token {name!r} (needed as eos/pad/chat special)")
            self._ids[name] = token_id
        self._eos, self._pad = self._ids[eos_token], self._ids[pad_token]

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def pad_id(self) -> int:
        return self._pad

    def special_id(self, name: str) -> int:
        token_id = self._ids.get(name, self._tok.token_to_id(name))
        if token_id is None:
            raise KeyError(f"HFTokenizer {self.path!r} has no token {name!r}")
        return token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


PIN = "#sha256="


def _tokenizer_file(path: str) -> str:
    return os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path


def tokenizer_digest(path: str | os.PathLike) -> str:
    """sha256 of a tokenizer.json (or its folder's)."""
    import hashlib

    with open(_tokenizer_file(os.fspath(path)), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def pin_tokenizer(spec: str, path: str | os.PathLike | None = None) -> str:
    """`spec` with the file's digest appended (`spec#sha256=<hex>`; 'byte' stays as it is), so a
    manifest that records it loads only that exact file (`path`: where `spec` resolves to)."""
    if spec in ("", "byte") or PIN in spec:
        return spec
    return f"{spec}{PIN}{tokenizer_digest(path or spec)}"


def load_tokenizer(spec: str | None = None, vocab_size: int = 512) -> Tokenizer:
    """`None` or `'byte'` -> ByteTokenizer(vocab_size); otherwise a path to tokenizer.json (or its
    folder), optionally pinned (`path#sha256=<hex>`, `pin_tokenizer`): a file whose digest differs
    (retrained or edited since the run that recorded it) raises ValueError naming both."""
    if spec in (None, "", "byte"):
        return ByteTokenizer(vocab_size)
    path, _, want = os.fspath(spec).partition(PIN)
    if want and os.path.exists(path):
        have = tokenizer_digest(path)
        if have != want:
            raise ValueError(f"tokenizer {_tokenizer_file(path)!r} has sha256 {have[:12]}..., but the "
                             f"run recorded {want[:12]}...: the file changed since (retrained?); use "
                             "the checkout the run was made with, or start a new run directory")
    return HFTokenizer(path)


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """A short JSON description, stored with records so mismatched tokenizers are detected."""
    kind = type(tokenizer).__name__
    extra = getattr(tokenizer, "path", None)
    return json.dumps({"kind": kind, "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id,
                       "pad_id": tokenizer.pad_id, "path": extra}, sort_keys=True)
