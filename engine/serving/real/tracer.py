"""Which lines of the release's own files a parse executed, and where a string local changed (worker side only).

`sys.settrace` with line events restricted to files under the release root: for each executed line it compares
the frame's string locals with their values at the previous line of that frame and records an edit
(`file:line`, variable, before, after) when one changed. A string that one expression produced into a new local, or
into one that held None (`reasoning_text, text, ... = parse(...)`, `x = text.strip()` on its first assignment), is a
"set" edit (no before), and so is a string made inside a call's arguments on an engine line or inside a return
expression (`return x.strip()`, `Result(text=y.strip())`). Non-string edits (a dropped call, `None`, a type change)
are recorded as type changes of a local. The last MAX_EDITS edits are kept, and of the older ones those whose text is
a piece of the model's (the reasoning parser's, before a tool parser's thousands). Python 3.11 has no sys.monitoring;
the cost is a few milliseconds a parse for SGLang and vLLM <= 0.20, tens for vLLM's parser engine (>= 0.21): the
backend traces by default only where it is cheap (RealEngine.traces_cheaply).
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_EDITS = 5000  # the most recent are kept: the last edits are the ones that made the response
MAX_FIELD_EDITS = 5000  # and, of the older ones, those that touch the model's text (its reasoning, its content)


class Tracer:
    """`text`: the model text the parse is given. Past MAX_EDITS edits, an older edit is kept when its text is a piece
    of the model's (a parser's tool-call loop makes thousands of edits after the reasoning parser made the one that
    decided the reasoning)."""

    def __init__(self, root: str, text: str | None = None) -> None:
        self.root = root
        self.text = text or ""
        self._lines: dict[str, set[int]] = {}  # file -> its executed lines
        self.edits: deque[dict] = deque(maxlen=MAX_EDITS)
        self.field_edits: list[dict] = []
        self._count = 0

    def _record(self, edit: dict) -> None:
        edit["seq"] = self._count
        self._count += 1
        if len(self.edits) == MAX_EDITS:
            oldest = self.edits[0]
            if len(self.field_edits) < MAX_FIELD_EDITS and (self._touches(oldest["after"])
                                                             or self._touches(oldest["before"])):
                self.field_edits.append(oldest)
        self.edits.append(edit)

    def _touches(self, value: Any) -> bool:
        """Whether a string shares a piece with the model's text: 16 characters of its start, middle or end are in
        it (shorter strings are too common to tell)."""
        if not isinstance(value, str) or len(value) < 8 or not self.text:
            return False
        width = min(16, len(value))
        return any(value[i:i + width] in self.text for i in (0, (len(value) - width) // 2, len(value) - width))

    def _frame_tracer(self, code) -> Any:
        """The trace function of one frame of `code`. It keeps the frame's locals as of the last change it saw and
        the line that ran last. It reads them again only after a line that can bind one (`_binding_lines`): after
        the others nothing can have changed. Then, on most lines, the frame's (live) locals compare equal to that
        copy, in C, and nothing is copied."""
        add_line = self._lines.setdefault(code.co_filename, set()).add
        edits_of = self._edits_of
        binding = _binding_lines(code)
        held: dict[str, Any] | None = None  # a copy of the frame's locals, as of the last change seen
        line = 0  # the line that ran last

        def trace(frame, event: str, arg: Any):
            nonlocal held, line
            if event == "line":
                if held is None:
                    held = dict(frame.f_locals)
                elif binding is None or line in binding:
                    now = frame.f_locals  # the frame's own dict, brought up to date by the access
                    if not _unchanged(now, held):
                        edits_of(frame, line, held, now)
                        held = dict(now)
                line = frame.f_lineno
                add_line(line)
            elif event == "return":
                now = frame.f_locals
                if held is not None and not _unchanged(now, held):
                    edits_of(frame, line, held, now)
                # `return text.strip()`: a string made in the return expression itself, not held by a local
                self._made_in_expression(frame, frame.f_lineno, f"return of {frame.f_code.co_name}", arg, now)
            return trace

        return trace

    def _edits_of(self, frame, line: int, before: dict[str, Any], now: dict[str, Any]) -> None:
        """The edits `line` made to the frame's locals: `before` as they were, `now` after it."""
        get = before.get
        for name, value in now.items():
            old = get(name, _MISSING)
            if old is value or not isinstance(value, _TRACKED):
                continue
            if not isinstance(old, _TRACKED):
                old = _MISSING
            if isinstance(value, str) and value and (old is _MISSING or old is None):
                self._record({"file": frame.f_code.co_filename, "line": line, "variable": name,
                              "before": None, "after": value[:200], "kind": "set"})
            elif old is _MISSING:
                continue
            elif isinstance(value, str) and isinstance(old, str) and old != value:
                self._record({"file": frame.f_code.co_filename, "line": line, "variable": name,
                              "before": old[:200], "after": value[:200], "kind": "string"})
            elif type(old) is not type(value) and (old is None or value is None or isinstance(old, str)):
                self._record({"file": frame.f_code.co_filename, "line": line, "variable": name,
                              "before": repr(old)[:200], "after": repr(value)[:200], "kind": "type"})

    def _made_in_expression(self, frame, line: int, what: str, value: Any, held: dict[str, Any]) -> None:
        """Set edits for the strings in `value` (itself, or the items of a tuple, list or dict it is) that no local of
        `frame` holds: an expression on `line` made them."""
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else (value,)
        kept = {id(v) for v in held.values()}
        for item in items:
            if isinstance(item, str) and item and id(item) not in kept:
                self._record({"file": frame.f_code.co_filename, "line": line, "variable": what, "before": None,
                              "after": item[:200], "kind": "set"})

    def _global(self, frame, event: str, arg: Any):
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename.startswith(self.root):
            # `Result(normal_text=splits[1].strip())`: an argument made in the call expression of an engine line (not
            # a literal of the caller's code, not a value one of its locals holds)
            code = caller.f_code
            made = {name: value for name, value in frame.f_locals.items()
                    if isinstance(value, str) and value and name != "self" and value not in code.co_consts}
            if made:
                held = dict(caller.f_locals)
                for name, value in made.items():
                    self._made_in_expression(caller, caller.f_lineno, f"argument {name} of {frame.f_code.co_name}",
                                             value, held)
        if frame.f_code.co_filename.startswith(self.root):
            return self._frame_tracer(frame.f_code)
        return None

    def start(self) -> None:
        sys.settrace(self._global)

    def stop(self) -> None:
        sys.settrace(None)

    def report(self, root: Path, result: dict | None = None) -> dict:
        """Every executed line, and the kept edits a cause can be read from when `result` (the parse's answer) is
        given (`answer_edits`)."""
        @functools.cache
        def rel(path: str) -> str:  # thousands of executed lines in a few dozen files: each file's path made once
            return str(Path(path).relative_to(root))

        lines = {rel(path): sorted(executed) for path, executed in sorted(self._lines.items()) if executed}
        kept = sorted({e["seq"]: e for e in [*self.field_edits, *self.edits]}.values(), key=lambda e: e["seq"])
        if result is not None:  # the few a cause reads, chosen before the others are copied (thousands a vLLM parse)
            kept = answer_edits(kept, result, rel)
        return {"lines": lines, "edits": [{**{k: v for k, v in e.items() if k != "seq"}, "file": rel(e["file"])}
                                          for e in kept]}


def answer_edits(edits: list[dict], result: dict, rel: Callable[[str], str]) -> list[dict]:
    """The edits the explorer reads a parse's causes from (backend.traced_edits, backend.field_sources), in order:
    those whose text is a field of the answer as recorded (reasoning, content, a call's arguments, cut at 200
    characters), every type change, every edit in a reasoning parser's file (`rel`: an edit's file as the report
    names it) and every value a function returned. The others (~92 % of a vLLM parser engine's trace: its lexer's and
    state machine's working strings) are read by neither, and were most of a traced reply (16 MB for the default
    matrix's 65 vLLM 0.33.0 traced parses)."""
    values = [result.get("reasoning"), result.get("content"),
              *(call.get("arguments") for call in result.get("tool_calls") or ())]
    answer = {value[:200] for value in values if isinstance(value, str)}
    return [e for e in edits if e["kind"] == "type" or e["after"] in answer or "reasoning" in rel(e["file"])
            or e["variable"].startswith("return of ")]


_BINDS = frozenset({"STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF", "STORE_NAME", "DELETE_NAME"})


@functools.cache
def _binding_lines(code) -> frozenset[int] | None:
    """The lines of `code` that can bind or unbind one of its locals; None when any line can. An edit is a local
    bound to another value (strings are immutable; a list or dict changed in place is the same value), so the lines
    between two of these need no comparison: most of a parse's lines (a test, a call, a return) bind nothing. Any
    line can when a closure shares the frame's variables (a cell or free variable another frame rebinds), when the
    code is not a function's (a module's or a class body's names), or when a binding instruction has no line of its
    own (it runs after some other line's)."""
    if code.co_cellvars or code.co_freevars or not code.co_flags & inspect.CO_OPTIMIZED:
        return None
    lines = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in _BINDS:
            if instruction.positions is None or instruction.positions.lineno is None:
                return None
            lines.add(instruction.positions.lineno)
    return frozenset(lines)


_MISSING = object()
_TRACKED = (str, type(None), list, dict, tuple)  # the values whose edits are recorded: text, or what holds text


def _unchanged(now: dict[str, Any], before: dict[str, Any]) -> bool:
    """Whether a frame's locals are the ones of its previous line, compared in C (on most lines nothing changed, and
    the loop over every local in `_local` was most of a traced parse's cost). Equal values record no edit there
    either: an edit needs a string that differs, or a value that was or became None, or a type change of a string
    (equal values of different types are only a str subclass's). A value whose == raises (an array) is compared
    local by local."""
    if len(now) != len(before):
        return False
    try:
        return now == before
    except Exception:  # noqa: BLE001 - an object's own __eq__ refused
        return False
