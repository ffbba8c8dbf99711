"""A chat template's outputs made visible in the text any Jinja runtime renders, to compare two runtimes' renders.

Every output tag `{{ EXPR }}` of the template source is wrapped in two marker outputs that print private-use
characters and the output's number (`{{- "\\ue000N\\ue001" }}{{ EXPR }}{{ "\\ue002N\\ue003" -}}`: the tag's own
whitespace control moves to the markers, so the text between the markers is exactly what the tag printed). Rendered
by any runtime (transformers' Jinja, MiniJinja, @huggingface/jinja), the marked text splits into segments: what output
N printed, and the literal text after each marker. Two runtimes' segments line up while their control flow does, so
the first segment whose text differs is the output (or the literal text) the runtimes disagree on.

The same scanner lists the block tags (`{% if %}`, `{% for %}`, ...) with their lines, and builds a capture variant of
the source that hands the values of an expression's variables to a Python function at one output or block tag: the
inputs with which one construct is then rendered alone under each runtime (engine.runtime_blame).

`jinja_source(node)` writes a Jinja expression back as source (fully parenthesised), for rendering one
sub-expression alone; None for a node it does not know.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes

OPEN, OPEN_END, CLOSE, CLOSE_END = "\ue000", "\ue001", "\ue002", "\ue003"
_MARKER = re.compile(f"{OPEN}(\\d+){OPEN_END}|{CLOSE}(\\d+){CLOSE_END}")


@dataclass(frozen=True)
class Tag:
    """One tag of the template source: `kind` "output" ({{ }}) or "block" ({% %}); `body` without its delimiters and
    whitespace control; `start`/`end` its span in the source; `line` 1-based."""

    kind: str
    body: str
    start: int
    end: int
    line: int
    left: str = ""  # whitespace control: "-", "+" or ""
    right: str = ""
    # Inside a macro, a `{% set x %}` block, a call or a filter block: what it prints becomes a value its caller may
    # trim or test, so it is not marked (its text is the marked output's that prints that value).
    captured: bool = False

    @property
    def keyword(self) -> str:
        """A block tag's statement word (if, elif, for, set, macro, ...)."""
        return self.body.strip().split(None, 1)[0] if self.kind == "block" and self.body.strip() else ""


@dataclass(frozen=True)
class ScannedTemplate:
    source: str
    tags: tuple[Tag, ...]

    @property
    def outputs(self) -> tuple[Tag, ...]:
        """The output tags that are marked: those whose text goes straight into the prompt."""
        return tuple(t for t in self.tags if t.kind == "output" and not t.captured)

    def marked(self) -> str:
        """The source with every output tag between markers (see the module docstring)."""
        return self._rewritten({index: _marked(tag, index) for index, tag in enumerate(self.outputs)})

    def with_capture(self, tag: Tag, names: tuple[str, ...]) -> str:
        """The source with `drift_capture({...})` of `names` printed (as "") just before `tag`."""
        values = ", ".join(f"{name!r}: {name}" for name in names)
        capture = "{{ drift_capture({" + values + "}) }}"
        return self.source[:tag.start] + capture + self.source[tag.start:]

    def _rewritten(self, replacements: dict[int, str]) -> str:
        pieces, cursor = [], 0
        for index, tag in enumerate(self.outputs):
            pieces += [self.source[cursor:tag.start], replacements[index]]
            cursor = tag.end
        return "".join(pieces) + self.source[cursor:]

    def line_of(self, position: int) -> int:
        return self.source.count("\n", 0, position) + 1


def _marked(tag: Tag, index: int) -> str:
    return (f'{{{{{tag.left} "{OPEN}{index}{OPEN_END}" }}}}{{{{{tag.body}}}}}'
            f'{{{{ "{CLOSE}{index}{CLOSE_END}" {tag.right}}}}}')


def unquoted_indices(source: str, start: int = 0) -> Iterator[int]:
    """The indices from `start` on that lie outside the string literals of Jinja source (a quote itself excluded)."""
    index, quote = start, ""
    while index < len(source):
        char = source[index]
        if quote:
            if char == "\\":
                index += 2
                continue
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        else:
            yield index
        index += 1


def _tag_end(source: str, start: int, closing: str) -> int:
    """The index of `closing` after `start`, outside string literals; -1 when there is none."""
    return next((index for index in unquoted_indices(source, start) if source.startswith(closing, index)), -1)


_RAW = re.compile(r"\s*raw\s*")
_CAPTURING = frozenset({"macro", "call", "filter"})
_CAPTURING_END = frozenset({"endmacro", "endcall", "endfilter", "endset"})
_ENDRAW = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")


@functools.lru_cache(maxsize=64)
def scan(source: str) -> ScannedTemplate | None:
    """The template's tags, or None where the scanner cannot read it (an unclosed tag)."""
    tags: list[Tag] = []
    cursor, depth = 0, 0
    while True:
        found = [i for i in (source.find("{{", cursor), source.find("{%", cursor), source.find("{#", cursor))
                 if i >= 0]
        if not found:
            break
        start = min(found)
        opener = source[start:start + 2]
        if opener == "{#":
            end = source.find("#}", start + 2)
            if end < 0:
                return None
            cursor = end + 2
            continue
        closing = "}}" if opener == "{{" else "%}"
        end = _tag_end(source, start + 2, closing)
        if end < 0:
            return None
        inner = source[start + 2:end]
        left = inner[0] if inner[:1] in ("-", "+") else ""
        right = inner[-1] if len(inner) > len(left) and inner[-1:] in ("-", "+") else ""
        body = inner[len(left):len(inner) - len(right)]
        line = source.count("\n", 0, start) + 1
        tag = Tag("output" if opener == "{{" else "block", body, start, end + 2, line, left, right, depth > 0)
        tags.append(tag)
        if tag.keyword in _CAPTURING or (tag.keyword == "set" and "=" not in body):
            depth += 1
        elif tag.keyword in _CAPTURING_END:
            depth = max(depth - 1, 0)
        cursor = end + 2
        if opener == "{%" and _RAW.fullmatch(body):
            raw_end = _ENDRAW.search(source, cursor)
            if raw_end is None:
                return None
            cursor = raw_end.end()
    return ScannedTemplate(source, tuple(tags))


@dataclass(frozen=True)
class Segment:
    """A piece of a marked render: what output `output` printed (`literal` False), or the literal text after a
    marker of that output (`literal` True; output -1: before the first marker). `start`/`end` index the text without
    markers."""

    output: int
    literal: bool
    text: str
    start: int
    end: int
    occurrence: int = 0  # which run of that output (0: its first), counted by its markers

    @property
    def key(self) -> tuple[int, bool]:
        return self.output, self.literal


def segments(marked_text: str) -> tuple[str, tuple[Segment, ...]] | None:
    """The render without its markers, and its segments; None when the markers do not nest (a template that cut or
    reordered rendered text, e.g. `|trim` over a block that printed markers)."""
    found: list[Segment] = []
    plain: list[str] = []
    stack: list[int] = []
    runs: dict[int, int] = {}  # output -> how many times it opened
    position, cursor, last_closed = 0, 0, -1

    def emit(text: str) -> None:
        nonlocal position
        if text:
            output, literal = (stack[-1], False) if stack else (last_closed, True)
            found.append(Segment(output, literal, text, position, position + len(text), runs.get(output, 1) - 1))
            plain.append(text)
            position += len(text)

    for match in _MARKER.finditer(marked_text):
        emit(marked_text[cursor:match.start()])
        if match.group(1) is not None:
            stack.append(int(match.group(1)))
            runs[stack[-1]] = runs.get(stack[-1], 0) + 1
        else:
            closed = int(match.group(2))
            if not stack or stack.pop() != closed:
                return None
            if not stack:
                last_closed = closed
        cursor = match.end()
    emit(marked_text[cursor:])
    text = "".join(plain)
    if stack or any(c in text for c in (OPEN, OPEN_END, CLOSE, CLOSE_END)):
        return None
    return text, tuple(found)


def segment_at(found: tuple[Segment, ...], position: int) -> int:
    """The index of the segment holding character `position` (the last one at the end of the text)."""
    for index, segment in enumerate(found):
        if segment.start <= position < segment.end:
            return index
    return len(found) - 1


# -- values captured at a tag ------------------------------------------------------------------------------------


class _Captures(threading.local):
    def __init__(self) -> None:
        self.rows: list[dict] | None = None


_CAPTURES = _Captures()


def drift_capture(values: dict) -> str:
    """Called by a capture variant of a template (ScannedTemplate.with_capture): keeps plain copies of the values."""
    if _CAPTURES.rows is not None:
        _CAPTURES.rows.append({name: plain_value(value) for name, value in values.items()
                               if not isinstance(value, jinja2.Undefined) and not callable(value)})
    return ""


def captured(run: Callable[[], Any]) -> list[dict]:
    """The values each drift_capture call received while `run` rendered a capture variant, in order."""
    _CAPTURES.rows = []
    try:
        run()
        return _CAPTURES.rows
    finally:
        _CAPTURES.rows = None


_LOOP_FIELDS = ("index", "index0", "revindex", "revindex0", "first", "last", "length")


def plain_value(value: Any) -> Any:
    """A template value as plain data every runtime takes: a namespace as its attributes, a loop as its counters."""
    if isinstance(value, jinja2.utils.Namespace):
        return {k: plain_value(v) for k, v in value._Namespace__attrs.items()}  # type: ignore[attr-defined]
    if isinstance(value, jinja2.runtime.LoopContext):
        return {name: getattr(value, name) for name in _LOOP_FIELDS}
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items() if not isinstance(v, jinja2.Undefined)}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, str):
        return str(value)  # Markup -> str
    return value


# -- expressions -------------------------------------------------------------------------------------------------

_ENVIRONMENT = jinja2.Environment()
_GLOBALS = frozenset({"namespace", "range", "dict", "raise_exception", "strftime_now", "lipsum", "cycler",
                      "joiner", "true", "false", "none", "True", "False", "None"})


def parse_expression(body: str) -> nodes.Expr | None:
    """The expression of an output tag's body, or a block tag's test (`if X`, `elif X`, `for a in X`)."""
    try:
        tree = _ENVIRONMENT.parse("{{ " + body + " }}")
    except jinja2.TemplateSyntaxError:
        return None
    output = tree.body[0] if tree.body else None
    if isinstance(output, nodes.Output) and len(output.nodes) == 1:
        return output.nodes[0]
    return None


def free_names(expression: nodes.Node) -> tuple[str, ...]:
    """The variables an expression reads, in first-read order, without the environment's globals."""
    names: list[str] = []
    for node in expression.find_all(nodes.Name):
        if node.ctx == "load" and node.name not in _GLOBALS and node.name not in names:
            names.append(node.name)
    if isinstance(expression, nodes.Name) and expression.name not in _GLOBALS and expression.name not in names:
        names.insert(0, expression.name)
    return tuple(names)


_BINARY = {nodes.Add: "+", nodes.Sub: "-", nodes.Mul: "*", nodes.Div: "/", nodes.FloorDiv: "//", nodes.Mod: "%",
           nodes.Pow: "**", nodes.And: "and", nodes.Or: "or"}
_COMPARE = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=", "in": "in", "notin": "not in"}


def _literal(value: Any) -> str | None:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\t", "\\t") \
            .replace("\r", "\\r") + "'"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return None


def jinja_source(node: nodes.Node) -> str | None:
    """`node` written back as Jinja source, every compound part parenthesised; None for a node not handled."""
    def arguments(args: list, kwargs: list) -> str | None:
        parts = [jinja_source(a) for a in args] + [
            None if (v := jinja_source(k.value)) is None else f"{k.key}={v}" for k in kwargs]
        return None if any(p is None for p in parts) else ", ".join(parts)  # type: ignore[arg-type]

    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Const):
        return _literal(node.value)
    if isinstance(node, (nodes.List, nodes.Tuple)):
        items = [jinja_source(i) for i in node.items]
        if any(i is None for i in items):
            return None
        inner = ", ".join(items)  # type: ignore[arg-type]
        return f"[{inner}]" if isinstance(node, nodes.List) else f"({inner}{',' if len(items) == 1 else ''})"
    if isinstance(node, nodes.Dict):
        pairs = [(jinja_source(p.key), jinja_source(p.value)) for p in node.items]
        if any(k is None or v is None for k, v in pairs):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    if isinstance(node, nodes.Getattr):
        inner = jinja_source(node.node)
        return None if inner is None else f"({inner}).{node.attr}"
    if isinstance(node, nodes.Getitem):
        inner, arg = jinja_source(node.node), _subscript(node.arg)
        return None if inner is None or arg is None else f"({inner})[{arg}]"
    if isinstance(node, nodes.Call):
        inner = jinja_source(node.node)
        args = arguments(node.args, node.kwargs)
        if inner is None or args is None or node.dyn_args or node.dyn_kwargs:
            return None
        return f"{inner}({args})"
    if isinstance(node, (nodes.Filter, nodes.Test)):
        inner = jinja_source(node.node) if node.node is not None else None
        args = arguments(node.args, node.kwargs)
        if inner is None or args is None or node.dyn_args or node.dyn_kwargs:
            return None
        call = f"{node.name}({args})" if node.args or node.kwargs else node.name
        return f"(({inner})|{call})" if isinstance(node, nodes.Filter) else f"(({inner}) is {call})"
    if isinstance(node, nodes.Not):
        inner = jinja_source(node.node)
        return None if inner is None else f"(not ({inner}))"
    if isinstance(node, nodes.Neg):
        inner = jinja_source(node.node)
        return None if inner is None else f"(-({inner}))"
    if isinstance(node, nodes.Concat):
        parts = [jinja_source(n) for n in node.nodes]
        return None if any(p is None for p in parts) else "(" + " ~ ".join(f"({p})" for p in parts) + ")"
    if type(node) in _BINARY:
        left, right = jinja_source(node.left), jinja_source(node.right)  # type: ignore[attr-defined]
        return None if left is None or right is None else f"(({left}) {_BINARY[type(node)]} ({right}))"
    if isinstance(node, nodes.Compare):
        parts = [jinja_source(node.expr)] + [jinja_source(op.expr) for op in node.ops]
        if any(p is None for p in parts) or any(op.op not in _COMPARE for op in node.ops):
            return None
        text = f"({parts[0]})"
        for op, part in zip(node.ops, parts[1:]):
            text += f" {_COMPARE[op.op]} ({part})"
        return f"({text})"
    if isinstance(node, nodes.CondExpr):
        test, then = jinja_source(node.test), jinja_source(node.expr1)
        other = jinja_source(node.expr2) if node.expr2 is not None else "none"
        return None if None in (test, then, other) else f"(({then}) if ({test}) else ({other}))"
    return None


def _subscript(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.Slice):
        parts = ["" if n is None else jinja_source(n) for n in (node.start, node.stop, node.step)]
        if any(p is None for p in parts):
            return None
        return ":".join(parts).rstrip(":") if node.step is None else ":".join(parts)  # type: ignore[arg-type]
    return jinja_source(node)
