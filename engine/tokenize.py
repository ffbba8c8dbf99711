"""Whole-string tokenization with per-token character offsets.

Strings are always tokenized whole: ids at a boundary can differ from the ids of the two halves, and that
difference is exactly what a token-level prefix break is made of. `SegmentCachedTokenizer` gives the same ids and
offsets faster, reusing only pieces that the tokenizer itself tokenizes independently (see its proof below), and
`encode_extending` tokenizes a text that starts like an earlier one at the cost of what is new in it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from engine.prefix import JoinedText, SharedSequence, common_prefix, text_tail
from engine.types import Rendered, Tokens


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

    def __init__(self, tokenizer_json: str, name: str, source_sha256: str | None = None) -> None:
        from tokenizers import Tokenizer as _RustTokenizer

        self._tok = _RustTokenizer.from_str(tokenizer_json)
        self.name = name
        self.source_sha256 = source_sha256  # of the tokenizer.json it was loaded from, where the caller checked it
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



_LOADED_HF: dict[str, HFTokenizer] = {}
_LOADING_HF: dict[str, threading.Lock] = {}  # one per file: models loading in parallel parse a shared file once
_LOADING_GUARD = threading.Lock()


def load_hf_tokenizer(tokenizer_json: bytes, sha256: str) -> HFTokenizer:
    """One `tokenizers.Tokenizer` per distinct tokenizer.json: Qwen3.5 and Qwen3.6 share one file, and parsing it
    takes half a second. Keyed by the file's verified sha256."""
    with _LOADING_GUARD:
        lock = _LOADING_HF.setdefault(sha256, threading.Lock())
    with lock:
        loaded = _LOADED_HF.get(sha256)
        if loaded is None:
            loaded = HFTokenizer(tokenizer_json.decode("utf-8"), name=f"tokenizer.json ({sha256[:12]})",
                                 source_sha256=sha256)
            _LOADED_HF[sha256] = loaded
    return loaded


def clear_loaded_tokenizers() -> None:
    """Forget shared tokenizers (for a cold-start measurement, together with `load_model.cache_clear()`)."""
    _LOADED_HF.clear()

# ---- Segment-cached tokenization ---------------------------------------------------------------------------------
#
# HF `tokenizers` cuts the input at added tokens before anything else (AddedVocabulary::extract_and_normalize, an
# Aho-Corasick search with MatchKind::LeftmostLongest): first at added tokens with normalized=false on the raw text,
# then at added tokens with normalized=true on each remaining piece after the normalizer ran on that piece. Only
# those pieces are normalized, pre-tokenized and run through the model, each on its own. So the ids of a piece
# between two added tokens do not depend on anything outside it, and can be reused across prompts, WHEN nothing
# else in the pipeline looks at where a piece sits in the whole string. `hf_segment_proof` checks that per
# tokenizer.json; tiktoken cuts at its special tokens the same way (CoreBPE::encode), `tiktoken_segment_proof`.

# Components that act on each piece alone, whatever its position (checked against tokenizers 0.23 sources).
_PIECEWISE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "Replace", "Prepend",
                          "BertNormalizer", "Precompiled", "Nmt", "ByteLevel"}
_PIECEWISE_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit",
                             "BertPreTokenizer", "UnicodeScripts", "CharDelimiterSplit", "FixedLength"}
_PIECEWISE_MODELS = {"BPE", "WordPiece", "WordLevel", "Unigram"}


def _component_problem(kind: str, config: dict | None, allowed: set[str]) -> str | None:
    """Why a normalizer / pre-tokenizer config could depend on a piece's position, or None when it cannot."""
    if config is None:
        return None
    name = config.get("type")
    if name == "Sequence":
        children = config.get("normalizers") if kind == "normalizer" else config.get("pretokenizers")
        for child in children or ():
            problem = _component_problem(kind, child, allowed)
            if problem:
                return problem
        return None
    if kind == "pre_tokenizer" and name == "Metaspace":
        # prepend_scheme "first" adds the prefix only to the piece at offset 0 of the original string.
        scheme = config.get("prepend_scheme", "always" if config.get("add_prefix_space", True) else "never")
        return None if scheme in ("always", "never") else f"the Metaspace pre-tokenizer prepends only to the " \
            f"first piece (prepend_scheme {scheme!r})"
    if name not in allowed:
        return f"its {kind} {name!r} is not known to act on each piece alone"
    return None


def _post_processor_problem(config: dict | None) -> str | None:
    if config is None:
        return None
    name = config.get("type")
    if name == "Sequence":
        for child in config.get("processors") or ():
            problem = _post_processor_problem(child)
            if problem:
                return problem
        return None
    if name in ("ByteLevel", "RobertaProcessing"):
        # trim_offsets with add_prefix_space treats the token at offset 0 differently (process_offsets).
        if config.get("trim_offsets") and config.get("add_prefix_space"):
            return f"its {name} post-processor trims the first token's offsets differently (trim_offsets and " \
                   "add_prefix_space)"
        return None
    if name in ("TemplateProcessing", "BertProcessing"):
        return None  # only adds special tokens, and encode() never asks it to
    return f"its post-processor {name!r} is not known to act on each token alone"


def _is_identity_normalizer(config: dict | None) -> bool:
    if config is None:
        return True
    return config.get("type") == "Sequence" and all(_is_identity_normalizer(c) for c in config.get("normalizers") or ())


def hf_segment_proof(config: dict) -> str | None:
    """None when reusing piece ids between added tokens is proven identical to whole-string tokenization for this
    tokenizer.json; otherwise the sentence saying why not (the wrapper then tokenizes whole strings)."""
    for token in config.get("added_tokens") or ():
        flags = [flag for flag in ("lstrip", "rstrip", "single_word") if token.get(flag)]
        if flags:
            return f"added token {token.get('content')!r} has {'/'.join(flags)}=true, so its match depends on the " \
                   "text around it"
        if token.get("normalized") and not _is_identity_normalizer(config.get("normalizer")):
            return f"added token {token.get('content')!r} has normalized=true and the normalizer changes text, so " \
                   "it is matched on normalized text"
    if config.get("truncation") or config.get("padding"):
        return "tokenizer.json configures truncation or padding, which act on the whole encoding"
    problem = (
        _component_problem("normalizer", config.get("normalizer"), _PIECEWISE_NORMALIZERS)
        or _component_problem("pre_tokenizer", config.get("pre_tokenizer"), _PIECEWISE_PRE_TOKENIZERS)
        or _post_processor_problem(config.get("post_processor"))
    )
    if problem:
        return problem
    model = config.get("model") or {}
    if model.get("type") not in _PIECEWISE_MODELS:
        return f"its model {model.get('type')!r} is not known to act on each pre-token alone"
    if model.get("dropout"):
        return "its BPE model has dropout, so tokenization is random"
    return None


def tiktoken_segment_proof(special_tokens: Iterable[str], max_same_class_run: int | None) -> str | None:
    """None when tiktoken's split at special tokens is the same leftmost-longest split the wrapper makes."""
    if max_same_class_run is not None:
        return (f"runs of more than {max_same_class_run} whitespace / non-whitespace characters are cut over the "
                "whole text before encoding, and a run can cross a special token")
    ordered = sorted(special_tokens)
    # CoreBPE finds specials with a regex alternation in hash order (leftmost-first): that equals leftmost-longest
    # exactly when no special token is a prefix of another (sorted order puts such a pair side by side).
    for shorter, longer in zip(ordered, ordered[1:]):
        if longer.startswith(shorter):
            return f"special token {shorter!r} is a prefix of {longer!r}, so tiktoken's split is order-dependent"
    return None


def leftmost_longest_pattern(words: Iterable[str]) -> re.Pattern[str] | None:
    """A regex finding `words` leftmost-longest (as Aho-Corasick MatchKind::LeftmostLongest), built as a trie so
    that a thousand added tokens cost one pass, not a thousand alternatives tried at every '<'."""
    trie: dict = {}
    for word in words:
        if not word:
            continue
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    if not trie:
        return None

    def build(node: dict) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # At a word's end, try the longer words first (greedy `?`), then stop here.
        return f"(?:{body})?" if "" in node else body

    return re.compile(build(trie))


@dataclass(frozen=True)
class SegmentPlan:
    """How a tokenizer's input is cut before anything else: the passes (each a pattern and the ids it finds),
    or why it cannot be (then `reason` says so and strings are tokenized whole)."""

    passes: tuple[tuple[re.Pattern[str], dict[str, int]], ...]
    reason: str | None = None

    @property
    def proven(self) -> bool:
        return self.reason is None


def hf_segment_config(backend: Any) -> dict:
    """The parts of a loaded `tokenizers.Tokenizer`'s configuration the proof reads, in tokenizer.json's shape.

    Read from the live object (cheap getters) rather than by parsing the multi-megabyte JSON a second time.
    """
    import json

    def state(component) -> dict | None:
        return json.loads(component.__getstate__()) if component is not None else None

    return {
        "added_tokens": [
            {"id": token_id, "content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
             "single_word": t.single_word, "normalized": t.normalized, "special": t.special}
            for token_id, t in sorted(backend.get_added_tokens_decoder().items())
        ],
        "normalizer": state(backend.normalizer),
        "pre_tokenizer": state(backend.pre_tokenizer),
        "post_processor": state(backend.post_processor),
        "truncation": backend.truncation,
        "padding": backend.padding,
        "model": {"type": type(backend.model).__name__, "dropout": getattr(backend.model, "dropout", None)},
    }


def hf_segment_plan(config: dict) -> SegmentPlan:
    reason = hf_segment_proof(config)
    if reason:
        return SegmentPlan((), reason)
    passes = []
    for normalized in (False, True):
        ids = {t["content"]: t["id"] for t in config.get("added_tokens") or ()
               if bool(t.get("normalized")) == normalized and t.get("content")}
        pattern = leftmost_longest_pattern(ids)
        if pattern is not None:
            passes.append((pattern, ids))
    return SegmentPlan(tuple(passes))


def tiktoken_segment_plan(special_tokens: dict[str, int], max_same_class_run: int | None) -> SegmentPlan:
    reason = tiktoken_segment_proof(special_tokens, max_same_class_run)
    if reason:
        return SegmentPlan((), reason)
    pattern = leftmost_longest_pattern(special_tokens)
    return SegmentPlan(((pattern, dict(special_tokens)),) if pattern is not None else ())


@dataclass(frozen=True)
class TokenizedText:
    """One text tokenized whole (`SegmentCachedTokenizer.encode_extending`), kept so that the next text that starts
    the same way reuses it: the text, its characters and ids as `SharedSequence`s (sharing what they have in common
    with the text before), and where the first pass found added tokens (start, end, ids up to the end)."""

    text: str | JoinedText
    chars: SharedSequence
    ids: SharedSequence
    match_starts: np.ndarray
    match_ends: np.ndarray
    token_ends: np.ndarray


_NO_MARKS = np.zeros(0, dtype=np.int64)


def _rebased(parent: SharedSequence | None, keep: int, tail: np.ndarray) -> SharedSequence:
    """`parent[:keep] + tail`, stored with the longest keep: the re-tokenized ids that equal the parent's are
    shared, not copied (the usual case: the new text extends the old one by whole pieces)."""
    if parent is not None and keep < parent.length:
        again = parent.slice(keep, keep + len(tail))
        same = np.flatnonzero(again != tail[:len(again)])
        agree = int(same[0]) if same.size else len(again)
        if keep + agree == parent.length:
            return SharedSequence(parent, parent.length, tail[agree:])
    return SharedSequence(parent, keep, tail)


class SegmentCachedTokenizer:
    """Whole-string tokenization, answered from pieces: the text between two added tokens is tokenized once and its
    ids reused in every prompt that holds it, where `plan` proves that equals tokenizing the whole string; each
    distinct string is also answered once. Same Tokenizer protocol, same ids and offsets as `inner.encode`."""

    def __init__(self, inner: Tokenizer, plan: SegmentPlan, *, name: str | None = None, max_strings: int = 4096,
                 max_segments: int = 16384, all_special_tokens: tuple[str, ...] | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.plan = plan
        # What transformers lists in this model's all_special_tokens (models.listed_special_tokens); None: not known,
        # the tokenizer file's special flags stand in. The engines' parsers read it (vLLM's parser engine drops them).
        self.all_special_tokens = all_special_tokens
        self._tokens_memo = lru_cache(maxsize=max_strings)(self._tokens_uncached)
        self._ids_memo = lru_cache(maxsize=max_strings)(self._ids_uncached)
        self._ids_lock = threading.Lock()
        self._segment = lru_cache(maxsize=max_segments)(inner.encode)
        self._segment_ids = lru_cache(maxsize=max_segments)(library_ids(inner))
        # How far past a position the first pass reads to decide whether an added token starts there.
        self._first_pass_reach = max(map(len, plan.passes[0][1]), default=0) if plan.passes else 0

    @property
    def segment_note(self) -> str:
        if self.plan.proven:
            return f"{self.name}: ids reused between added tokens (proven from its configuration)"
        return f"{self.name}: whole strings only, because {self.plan.reason}"

    @property
    def backend(self) -> Any:
        return self.inner.backend  # type: ignore[attr-defined]

    def cache_clear(self) -> None:
        for memo in (self._tokens_memo, self._ids_memo, self._segment, self._segment_ids):
            memo.cache_clear()

    def cache_stats(self) -> dict[str, int]:
        """Hits and misses of the string and segment caches since the last `cache_clear`."""
        strings, segments = self._ids_memo.cache_info(), self._segment_ids.cache_info()
        return {"string_hits": strings.hits, "string_misses": strings.misses,
                "segment_hits": segments.hits, "segment_misses": segments.misses}

    def encode(self, text: str) -> Tokens:
        return self._tokens_memo(text)

    def encode_ids(self, text: str) -> tuple[int, ...]:
        """`encode(text).ids` without building offsets, which the simulator never reads. One thread at a time:
        `lru_cache` lets two threads that ask a new string together (a cold matrix's lanes) both miss and tokenize
        it, and the string misses (`cache_stats`, the bench's floor check) then count it twice."""
        with self._ids_lock:
            return self._ids_memo(text)

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self.inner.decode(ids)

    def token_text(self, token_id: int) -> str:
        return self.inner.token_text(token_id)

    def is_special(self, token_id: int) -> bool:
        return self.inner.is_special(token_id)

    def token_id(self, text: str) -> int | None:
        return self.inner.token_id(text)

    def pieces(self, text: str) -> list[tuple[int, str, int | None]]:
        """(start, piece, id) in order: an added token with its id, or text between them with None."""
        return self._cut(text, 0)[0]

    def _cut(self, text: str, offset: int) -> tuple[list[tuple[int, str, int | None]], list[tuple[int, int]]]:
        """The pieces of `text` (starts shifted by `offset`), and the (start, end) of the first pass's matches."""
        out: list[tuple[int, str, int | None]] = [(offset, text, None)]
        first_pass: list[tuple[int, int]] = []
        for number, (pattern, ids) in enumerate(self.plan.passes):
            cut: list[tuple[int, str, int | None]] = []
            for start, piece, token in out:
                if token is not None:
                    cut.append((start, piece, token))
                    continue
                at = 0
                for match in pattern.finditer(piece):
                    if match.start() > at:
                        cut.append((start + at, piece[at:match.start()], None))
                    cut.append((start + match.start(), match.group(), ids[match.group()]))
                    if number == 0:
                        first_pass.append((start + match.start(), start + match.end()))
                    at = match.end()
                if at < len(piece):
                    cut.append((start + at, piece[at:], None))
            out = cut
        return out, first_pass

    def encode_extending(self, text: str | JoinedText, previous: TokenizedText | None = None,
                         known: int = 0) -> TokenizedText:
        """`encode_ids(text)`, reusing what `previous` (another text tokenized this way) shares with it; the first
        `known` characters of the two are known to agree (`known_agreement`), so only the rest is compared.

        The first pass finds added tokens leftmost-longest, and deciding whether one starts at position p reads
        at most the longest added token's length from p. So where the two texts agree before character d, the
        first pass finds the same matches starting at or before d - longest, and resumes after the last of them
        at the same place; later passes cut the pieces between, which are identical. Pieces before that match's
        end keep their ids (each piece's ids depend on the piece alone: `plan`), the rest is cut and tokenized
        afresh. The result is the same ids as tokenizing `text` whole (tests/test_tokenize_segments.py).
        """
        if not self.plan.proven or not self.plan.passes:
            return _tokenized_whole(self.inner, text, previous, known)
        shared = common_prefix(previous.text, text, known) if previous is not None else 0
        chars = SharedSequence(previous.chars if previous is not None else None, shared, text_tail(text, shared))
        kept = 0
        if previous is not None:
            kept = int(np.searchsorted(previous.match_starts, shared - self._first_pass_reach, side="right"))
        keep_chars = int(previous.match_ends[kept - 1]) if kept else 0
        keep_tokens = int(previous.token_ends[kept - 1]) if kept else 0
        pieces, first_pass = self._cut(text_tail(text, keep_chars), keep_chars)
        tail: list[int] = []
        token_end: dict[int, int] = {}  # end of a first-pass match -> ids before it
        for start, piece, token in pieces:
            if token is None:
                tail.extend(self._segment_ids(piece))
            else:
                tail.append(token)
                token_end[start + len(piece)] = keep_tokens + len(tail)
        ids = _rebased(previous.ids if kept else None, keep_tokens, np.asarray(tail, dtype=np.int32))
        starts = np.fromiter((s for s, _ in first_pass), dtype=np.int64, count=len(first_pass))
        ends = np.fromiter((e for _, e in first_pass), dtype=np.int64, count=len(first_pass))
        tokens = np.fromiter((token_end[e] for _, e in first_pass), dtype=np.int64, count=len(first_pass))
        if kept:
            starts = np.concatenate((previous.match_starts[:kept], starts))
            ends = np.concatenate((previous.match_ends[:kept], ends))
            tokens = np.concatenate((previous.token_ends[:kept], tokens))
        return TokenizedText(text, chars, ids, starts, ends, tokens)

    def _ids_uncached(self, text: str) -> tuple[int, ...]:
        if not self.plan.proven:
            return self.inner.encode(text).ids
        ids: list[int] = []
        for _, piece, token in self.pieces(text):
            if token is None:
                ids.extend(self._segment_ids(piece))
            else:
                ids.append(token)
        return tuple(ids)

    def _tokens_uncached(self, text: str) -> Tokens:
        if not self.plan.proven:
            return self.inner.encode(text)
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for start, piece, token in self.pieces(text):
            if token is None:
                tokens = self._segment(piece)
                ids.extend(tokens.ids)
                offsets.extend((a + start, b + start) for a, b in tokens.offsets)
            else:
                ids.append(token)
                offsets.append((start, start + len(piece)))
        return Tokens(ids=tuple(ids), offsets=partition_offsets(offsets), text=text)



def segment_cached_hf(inner: HFTokenizer, name: str,
                      all_special_tokens: tuple[str, ...] | None = None) -> SegmentCachedTokenizer:
    return SegmentCachedTokenizer(inner, hf_segment_plan(hf_segment_config(inner.backend)), name=name,
                                  all_special_tokens=all_special_tokens)


def segment_cached_tiktoken(tokenizer: Any) -> SegmentCachedTokenizer:
    """Wrap an engine.tiktoken_tokenizer.TiktokenTokenizer (GPT-OSS, Kimi)."""
    specials = {text: tokenizer.token_id(text) for text in tokenizer.backend.special_tokens_set}
    # Kimi's long-run cutting (TiktokenTokenizer's private setting) looks across special tokens; the proof says so.
    plan = tiktoken_segment_plan(specials, getattr(tokenizer, "_max_same_class_run", None))
    return SegmentCachedTokenizer(tokenizer, plan)

def library_ids(inner: Tokenizer) -> Callable[[str], tuple[int, ...]]:
    """`inner.encode(piece).ids` straight from the library, without building character offsets, for a piece that
    holds no added / special token (what `SegmentCachedTokenizer.pieces` hands it)."""
    backend = getattr(inner, "backend", None)
    if isinstance(inner, HFTokenizer):
        return lambda text: tuple(backend.encode(text, add_special_tokens=False).ids)
    # A TiktokenTokenizer with no long-run cutting encodes the whole text with every special token allowed; a
    # piece holds no special token, so that is encode_ordinary (which skips converting the 1,000-name allowed set
    # on every call, a third of a millisecond for o200k_harmony).
    if backend is not None and hasattr(backend, "encode_ordinary") and \
            getattr(inner, "_max_same_class_run", None) is None:
        return lambda text: tuple(backend.encode_ordinary(text))
    return lambda text: inner.encode(text).ids


def tokenize_extending(tokenizer: Tokenizer, text: str | JoinedText, previous: TokenizedText | None = None,
                       known: int = 0) -> TokenizedText:
    """`text` tokenized whole, reusing what it shares with `previous` where the tokenizer proves that equal
    (`SegmentCachedTokenizer.encode_extending`); any other tokenizer tokenizes the whole text. The first `known`
    characters of `text` and `previous.text` are known to agree (`known_agreement`)."""
    extending = getattr(tokenizer, "encode_extending", None)
    return extending(text, previous, known) if extending is not None else \
        _tokenized_whole(tokenizer, text, previous, known)


def known_agreement(rendered: Rendered, previous: TokenizedText | None) -> int:
    """How many leading characters `rendered` is known to share with the text `previous` tokenized, from how the
    two were rendered (`Rendered.known_prefix`, about that very text object), without comparing them: 0 when
    nothing is known."""
    known = rendered.known_prefix
    return known[1] if known is not None and previous is not None and known[0] is previous.text else 0


def _tokenized_whole(tokenizer: Tokenizer, text: str | JoinedText, previous: TokenizedText | None,
                     known: int = 0) -> TokenizedText:
    """`text` tokenized whole by `tokenizer`, nothing reused but the characters it shares with `previous`."""
    shared = common_prefix(previous.text, text, known) if previous is not None else 0
    chars = SharedSequence(previous.chars if previous is not None else None, shared, text_tail(text, shared))
    ids = SharedSequence(None, 0, np.asarray(tokenizer.encode(str(text)).ids, dtype=np.int32))
    return TokenizedText(text, chars, ids, _NO_MARKS, _NO_MARKS, _NO_MARKS)


def token_ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """The ids of `text` tokenized whole; a segment-cached tokenizer answers without building offsets."""
    fast = getattr(tokenizer, "encode_ids", None)
    return fast(text) if fast is not None else tokenizer.encode(text).ids
