"""Whole-string tokenization with per-token character offsets.

Strings are always tokenized whole: ids at a boundary can differ from the ids of the two halves, and that
difference is exactly what a token-level prefix break is made of.
"""

from __future__ import annotations

from typing import Protocol

from engine.types import Tokens


class Tokenizer(Protocol):
    name: str  # e.g. "qwen3.5 tokenizer.json (tokenizers 0.23.3)"

    def encode(self, text: str) -> Tokens:
        """Tokenize `text` whole, special tokens as single ids, no BOS/EOS added."""

    def decode(self, ids: list[int] | tuple[int, ...]) -> str: ...

    def token_text(self, token_id: int) -> str:
        """The text one token stands for (may be a partial UTF-8 character, shown with U+FFFD)."""

    def is_special(self, token_id: int) -> bool: ...

    def token_id(self, text: str) -> int | None:
        """The single id of a special/added token written as `text`, or None."""


def partition_offsets(offsets) -> tuple[tuple[int, int], ...]:
    """Make token spans a partition of the text: a character belongs to the first token that holds any of its bytes.

    Byte-level BPE splits a multi-byte character over several tokens, and `tokenizers` gives each of them the
    whole character's span; the later ones get an empty span at the character's end.
    """
    out: list[tuple[int, int]] = []
    end = 0
    for start, stop in offsets:
        start = max(start, end)
        stop = max(stop, start)
        out.append((start, stop))
        end = stop
    return tuple(out)


class HFTokenizer:
    """A Hugging Face `tokenizer.json`, loaded with `tokenizers` directly.

    transformers 5.x `AutoTokenizer` rebuilds Qwen3.5's BPE with the Qwen2 split pattern and mis-tokenizes it,
    so the file is always loaded through `tokenizers.Tokenizer`.
    """

    def __init__(self, tokenizer_json: str, name: str) -> None:
        from tokenizers import Tokenizer as _RustTokenizer

        self._tok = _RustTokenizer.from_str(tokenizer_json)
        self.name = name
        self._added = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        self._special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        self._added_ids = frozenset(self._added.values())

    @property
    def backend(self):
        return self._tok

    def encode(self, text: str) -> Tokens:
        enc = self._tok.encode(text, add_special_tokens=False)
        return Tokens(ids=tuple(enc.ids), offsets=partition_offsets(enc.offsets), text=text)

    def encode_batch(self, texts: list[str]) -> list[Tokens]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [Tokens(ids=tuple(e.ids), offsets=partition_offsets(e.offsets), text=t) for e, t in zip(encs, texts)]

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._added_ids

    def token_id(self, text: str) -> int | None:
        return self._added.get(text)
