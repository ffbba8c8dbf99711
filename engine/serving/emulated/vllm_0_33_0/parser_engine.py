"""vLLM 0.33.0's declarative parser engine (vllm/parser/engine/), the parts its DSML and GLM configurations run
unchanged: the incremental lexer, the event the state machine emits, the streamable prefix of the arguments and the
reading of a call body that carries its own name. The family modules configure these with their grammars."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType


@dataclass
class Event:
    """What the state machine emits for the parser engine (streaming_parser_engine.py:410-584)."""

    kind: str
    value: str = ""
    index: int = -1


# ---------------------------------------------------------------- lexer (incremental_lexer.py)
@cache
def lexer_tables(literals: tuple[tuple[str, str], ...]
                 ) -> tuple[Mapping[str, tuple[tuple[str, str], ...]], frozenset[str], int, re.Pattern]:
    """What a Lexer reads but never changes (literals by first character, their proper prefixes, the longest length,
    the first characters' pattern), built once per literal set instead of once per parse."""
    by_first: dict[str, tuple[tuple[str, str], ...]] = {}
    for literal, name in literals:
        by_first[literal[0]] = (*by_first.get(literal[0], ()), (literal, name))
    prefixes = frozenset(literal[:i] for literal, _ in literals for i in range(1, len(literal)))
    first_chars = re.compile("[" + "".join(re.escape(c) for c in sorted(by_first)) + "]")
    return MappingProxyType(by_first), prefixes, max(len(literal) for literal, _ in literals), first_chars


class Lexer:
    """Longest literal at the buffer start wins; a buffer that is a proper prefix of a literal is held back until
    the next chunk (incremental_lexer.py:184-271). Works on an index instead of re-slicing the buffer, so a 1 MB
    output lexes in linear time; the tokens produced are the same."""

    def __init__(self, literals: list[tuple[str, str]]) -> None:
        """`literals`: (text, terminal name) pairs."""
        tables = lexer_tables(tuple(literals))
        self.by_first, self.prefixes, self.max_length, self.first_chars = tables
        self.buffer = ""

    def feed(self, text: str) -> list[tuple[str | None, str]]:
        self.buffer += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[str | None, str]]:
        tokens = self._drain(final=True)
        if self.buffer:
            tokens.append((None, self.buffer))
            self.buffer = ""
        return tokens

    def _drain(self, final: bool) -> list[tuple[str | None, str]]:
        tokens: list[tuple[str | None, str]] = []
        text, position, size = self.buffer, 0, len(self.buffer)
        while position < size:
            if self.first_chars.search(text, position) is None:
                tokens.append((None, text[position:]))
                position = size
                break
            best: tuple[str, str] | None = None
            for literal, name in self.by_first.get(text[position], ()):
                if text.startswith(literal, position) and (best is None or len(literal) > len(best[0])):
                    best = (literal, name)
            if not final and size - position < self.max_length and text[position:] in self.prefixes:
                break  # could still become a longer terminal: wait for the next chunk
            if best is not None:
                tokens.append((best[1], best[0]))
                position += len(best[0])
                continue
            end = self._content_boundary(text, position)
            tokens.append((None, text[position:end]))
            position = end
        self.buffer = text[position:]
        return tokens

    def _content_boundary(self, text: str, position: int) -> int:
        """The first later index where a literal starts, or where the text ends inside one (incremental_lexer.py:
        273-285); only literals with that first character can match there."""
        size = len(text)
        found = self.first_chars.search(text, position + 1)
        while found is not None:
            index = found.start()
            for literal, _ in self.by_first[text[index]]:
                if text.startswith(literal[: size - index], index):
                    return index
            found = self.first_chars.search(text, index + 1)
        return size


# ---------------------------------------------------------------- arguments (parser_engine.py)
_JSON_TOKEN = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)("?)|[{}\[\]:]', re.DOTALL)
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def safe_argument_prefix(text: str, string_keys: set[str] | None) -> tuple[str, bool]:
    """parser_engine.py:347-418 _safe_arg_prefix: the JSON up to the last top-level value, and whether that value is
    an open string of a string-typed key (it streams; any other trailing value is held back because coercion may
    still change it). Scans strings as whole tokens instead of character by character."""
    last_colon, last_key, pending_key, depth = -1, None, None, 0
    for token in _JSON_TOKEN.finditer(text):
        char = token.group(0)
        if char.startswith('"'):
            if token.group(2) and depth == 1:
                pending_key = token.group(1)
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif depth == 1:
            last_colon, last_key, pending_key = token.start(), pending_key, None
    if last_colon < 0:
        return "", False
    end = last_colon + 1
    while end < len(text) and text[end] in " \t\n\r":
        end += 1
    if end >= len(text) or text[end] != '"' or (string_keys is not None and last_key not in string_keys):
        return text[:end], False
    closing = _STRING_REST.match(text, end + 1)
    return (text[: closing.end() - 1] if closing else text), True


def name_and_arguments(raw: str) -> tuple[object, str]:
    """parser_engine.py:1208-1237: a nameless body is read as {"name": ..., "arguments"|"parameters": ...} JSON."""
    body = raw.strip()
    try:
        parsed = json.loads(body)
    except ValueError:
        return "", body
    if not isinstance(parsed, dict):
        return "", body
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)
