"""Per-character provenance folded into spans, and the lookups the explorer needs."""

from __future__ import annotations

from dataclasses import dataclass

from engine.types import Rendered


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    message_index: int
    source_line: int


def spans(rendered: Rendered) -> list[Span]:
    """Maximal runs of characters with the same message and the same source line."""
    out: list[Span] = []
    start = 0
    n = len(rendered.text)
    for i in range(1, n + 1):
        if i == n or (rendered.message_index[i], rendered.source_line[i]) != (
            rendered.message_index[start], rendered.source_line[start]
        ):
            out.append(Span(start, i, rendered.message_index[start], rendered.source_line[start]))
            start = i
    return out
