"""Helpers the family parsers of the emulations share: declared tool schemas, special tokens in streamed chunks."""

from __future__ import annotations

import re
from bisect import bisect_right


def tool_schema(tools: list[dict], name: str) -> dict | None:
    """The parameters schema of the declared tool `name`, or None when the request does not declare it."""
    for tool in tools:
        function = tool.get("function", tool)
        if function.get("name") == name:
            parameters = function.get("parameters")
            return parameters if isinstance(parameters, dict) else {}
    return None


def keep_special_tokens_whole(chunks: list[str], specials: tuple[str, ...]) -> list[str]:
    """Move every chunk boundary that falls inside a special token to the token's end.

    A special token is one token id, so no real detokenized delta splits it; callers' fixed-width chunks can.
    Chunks that already keep them whole (like the conformance corpus's) come back unchanged.
    """
    text = "".join(chunks)
    spans = sorted((start, start + len(token)) for start, token in special_token_starts(text, specials))
    if not spans:
        return list(chunks)
    starts = [start for start, _ in spans]
    result: list[str] = []
    pending: list[str] = []
    position = 0
    for chunk in chunks:
        pending.append(chunk)
        position += len(chunk)
        span = bisect_right(starts, position - 1) - 1
        if span >= 0 and spans[span][0] < position < spans[span][1]:
            continue  # this boundary would cut a special token
        result.append("".join(pending))
        pending = []
    if pending:
        result.append("".join(pending))
    return result or [""]


def special_token_starts(text: str, specials: tuple[str, ...]) -> list[tuple[int, str]]:
    found = []
    for token in specials:
        start = text.find(token)
        while start != -1:
            found.append((start, token))
            start = text.find(token, start + len(token))
    return found


def special_token_deltas(text: str, chunks: list[str], specials: re.Pattern[str]) -> list[str]:
    """Streaming deltas: the caller's chunk boundaries, except that a special token (a match of `specials`) is never
    split and always arrives as a delta of its own (one token per step, as the detokenizer streams it)."""
    inside = bytearray(len(text) + 1)
    cuts = {0, len(text)}
    for match in specials.finditer(text):
        inside[match.start() + 1 : match.end()] = b"\x01" * (match.end() - match.start() - 1)
        cuts.update((match.start(), match.end()))
    position = 0
    for chunk in chunks:
        position += len(chunk)
        if position <= len(text) and not inside[position]:
            cuts.add(position)
    ordered = sorted(cuts)
    return [text[a:b] for a, b in zip(ordered, ordered[1:]) if b > a] or [""]


def partial_token_length(text: str, token: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `token`: what a streaming detector holds back
    until the next delta tells whether the token follows (SGLang's _ends_with_partial_token,
    reasoning_parser.py:311-319)."""
    for size in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-size:]):
            return size
    return 0


def schema_properties(schema: object) -> dict:
    """SGLang's get_schema_properties (function_call/utils.py:307-323): the schema's top-level properties, else those
    merged from its anyOf/oneOf/allOf branches (first one wins)."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    if isinstance(properties, dict):
        return properties
    merged: dict = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list):
            for branch in branches:
                for key, value in schema_properties(branch).items():
                    merged.setdefault(key, value)
    return merged
