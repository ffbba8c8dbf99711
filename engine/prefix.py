"""Longest common prefixes, without a per-item Python loop and without copying whole sequences.

`common_prefix` compares two token-id sequences or two strings. `SharedSequence` stores a sequence as the first
`keep` items of another one plus its own tail: each request of an agent session extends the previous one, so a
session of N requests holds what is new in each, not N copies of a growing history; `shared_common_prefix`
compares two of them starting where their structure already says they agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class JoinedText:
    """A string kept as the pieces a render made it of, joined only when read whole (`str`): two renders of a long
    history that are known to agree up to some character are compared, and tokenized, from there on (`tail`), so
    a request reads what is new in it, not the history. Immutable; the pieces are not copied."""

    __slots__ = ("length", "_pieces", "_joined")

    def __init__(self, pieces: list[str], length: int) -> None:
        self.length = length
        self._pieces: list[str] | None = pieces
        self._joined: str | None = None

    def __len__(self) -> int:
        return self.length

    def __str__(self) -> str:
        joined = self._joined
        if joined is None:
            joined = self._joined = "".join(self._pieces or ())
            self._pieces = None
        return joined

    def tail(self, start: int) -> str:
        """`str(self)[start:]`, from the last pieces only."""
        pieces, start = self._pieces, max(start, 0)
        if pieces is None or start < self.length // 2:  # most of the text: joined once, kept, then sliced
            return str(self)[start:]
        out: list[str] = []
        end = self.length
        for piece in reversed(pieces):
            if end <= start:
                break
            begin = end - len(piece)
            out.append(piece[start - begin:] if begin < start else piece)
            end = begin
        out.reverse()
        return "".join(out)


def text_tail(text: str | JoinedText, start: int) -> str:
    """`text[start:]` of a str or a JoinedText."""
    return text[start:] if isinstance(text, str) else text.tail(start)


def common_prefix(a: Sequence | JoinedText, b: Sequence | JoinedText, known: int = 0) -> int:
    """Length of the longest common prefix of `a` and `b` (lists, tuples, strings or JoinedTexts), given that their
    first `known` items agree (the caller knows it without comparing them: only the rest is read)."""
    n = min(len(a), len(b))
    known = min(max(known, 0), n)
    if type(a) is JoinedText or type(b) is JoinedText:
        return known + common_prefix(text_tail(a, known), text_tail(b, known))  # type: ignore[arg-type]
    if isinstance(a, str) and isinstance(b, str):
        return _common_prefix_str(a, b, n, known)
    if a[known:n] == b[known:n]:
        return n
    return _bisected(a, b, known, n)


def common_prefix_from_end(a: list, b: list) -> int:
    """`common_prefix` of two lists that usually differ only in their last items (the pieces of two renders of a
    growing history): searched down from the end, so the usual case compares the lists once. List comparison skips
    identical items at C speed."""
    n = min(len(a), len(b))
    good, bad, step = 0, n + 1, 1  # a[:good] == b[:good]; a[:bad] != b[:bad] (n + 1: not known yet)
    while bad - step > good:
        j = bad - step
        # A window whose last items differ cannot agree: only a window that may is compared whole.
        if a[j - 1] == b[j - 1] and a[:j] == b[:j]:
            good = j
            break
        bad, step = j, step * 2
    return _bisected(a, b, good, bad)


def _bisected(a: Sequence, b: Sequence, lo: int, hi: int) -> int:
    """The common prefix of `a` and `b`, given that a[:lo] == b[:lo] holds and a[:hi] == b[:hi] does not: by
    bisection, comparing only the window between."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_prefix_str(a: str, b: str, n: int, known: int) -> int:
    # startswith compares in place: only the probe (the rest of the shorter one, then half, a quarter, ... of the
    # rest) is ever copied.
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    if longer.startswith(shorter[known:] if known else shorter, known):
        return n
    lo, hi = known, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the longest common suffix of two strings, at most `limit`: compared in place with endswith, as
    `_common_prefix_str` does from the front (only the probed window of `b` is copied, never a reversed string)."""
    la, lb = len(a), len(b)
    n = min(la, lb, max(limit, 0))
    if a.endswith(b[lb - n:]):
        return n
    lo, hi = 0, n  # a and b agree on their last lo characters, not on their last hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.endswith(b[lb - mid:lb - lo], 0, la - lo):
            lo = mid
        else:
            hi = mid
    return lo


class SharedSequence:
    """The first `keep` items of `parent`, then `tail` (a str, or a numpy array of token ids); immutable.

    Reading a slice walks the parents without recursion, so chains as long as a session are fine; `materialize`
    builds the whole sequence (a str, or a tuple of ints) only for a view that reads it.
    """

    __slots__ = ("parent", "keep", "tail", "length")

    def __init__(self, parent: SharedSequence | None, keep: int, tail: Any) -> None:
        if parent is None:
            keep = 0
        elif not 0 <= keep <= parent.length:
            raise ValueError(f"keep {keep} outside the parent's {parent.length} items")
        self.parent, self.keep, self.tail = parent, keep, tail
        self.length = keep + len(tail)

    def __len__(self) -> int:
        return self.length

    def slice(self, start: int, stop: int) -> Any:
        """Items start..stop-1, as the tail's type."""
        start, stop = max(start, 0), min(stop, self.length)
        parts: list[Any] = []
        node: SharedSequence | None = self
        while node is not None and start < stop:
            if stop > node.keep:
                low = max(start, node.keep)
                parts.append(node.tail[low - node.keep:stop - node.keep])
                stop = low
            node = node.parent
        parts.reverse()
        if isinstance(self.tail, str):
            return "".join(parts)
        return np.concatenate(parts) if parts else self.tail[:0]

    def materialize(self) -> Any:
        whole = self.slice(0, self.length)
        return whole if isinstance(whole, str) else tuple(whole.tolist())


def shared_common_prefix(x: SharedSequence, y: SharedSequence, known: int = 0) -> int:
    """Longest common prefix of two shared sequences of ids, given that their first `known` items agree.

    When one extends the other, the items it kept from its parent agree by construction; the rest is compared in
    growing blocks, so the cost follows the length of the difference region, not of the sequences.
    """
    if x.parent is y:
        known = max(known, x.keep)
    elif y.parent is x:
        known = max(known, y.keep)
    n = min(x.length, y.length)
    at, step = min(known, n), 256
    while at < n:
        stop = min(n, at + step)
        differ = np.flatnonzero(x.slice(at, stop) != y.slice(at, stop))
        if differ.size:
            return at + int(differ[0])
        at, step = stop, step * 4
    return n
