"""One injected engine edit each, for the blame benchmark (tests/blame/cases.yaml): applied to what the real engine
emulation returned for a turn, recorded as an edit at the line of its own `return`, as an engine would cite it."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import replace

from engine.types import Edit, Location, ParseResult

PATH = "tests/blame/injections.py"


def _edit(step: str, before: str, after: str, function: Callable) -> Edit:
    lines, first = inspect.getsourcelines(function)
    line = first + next(i for i, text in enumerate(lines) if text.strip().startswith("return "))
    return Edit(step, before, after, Location("injected", PATH, line), f"injected: {step}")


def _with(parse: ParseResult, edit: Edit, **fields) -> ParseResult:
    return replace(parse, edits=(*parse.edits, edit), **fields)


def _calls(parse: ParseResult, arguments: Callable[[str], str]) -> tuple:
    return tuple(replace(c, arguments=arguments(c.arguments)) for c in parse.tool_calls)


def reasoning_without_dots(parse: ParseResult) -> ParseResult:
    after = (parse.reasoning or "").replace(".", "")
    return _with(parse, _edit("reasoning_dots", parse.reasoning or "", after, reasoning_without_dots), reasoning=after)


def reasoning_dropped(parse: ParseResult) -> ParseResult:
    return _with(parse, _edit("reasoning_dropped", parse.reasoning or "", "", reasoning_dropped), reasoning=None)


def reasoning_trailing_newline(parse: ParseResult) -> ParseResult:
    after = (parse.reasoning or "") + "\n"
    edit = _edit("reasoning_newline", parse.reasoning or "", after, reasoning_trailing_newline)
    return _with(parse, edit, reasoning=after)


def arguments_keys_reversed(parse: ParseResult) -> ParseResult:
    calls = _calls(parse, lambda a: json.dumps(dict(reversed(json.loads(a).items())), ensure_ascii=False))
    edit = _edit("args_reversed", parse.tool_calls[0].arguments, calls[0].arguments, arguments_keys_reversed)
    return _with(parse, edit, tool_calls=calls)


def arguments_numbers_as_strings(parse: ParseResult) -> ParseResult:
    def as_strings(arguments: str) -> str:
        loaded = json.loads(arguments)
        return json.dumps({k: str(v) if isinstance(v, int) else v for k, v in loaded.items()}, ensure_ascii=False)

    calls = _calls(parse, as_strings)
    edit = _edit("args_numbers_as_strings", parse.tool_calls[0].arguments, calls[0].arguments,
                 arguments_numbers_as_strings)
    return _with(parse, edit, tool_calls=calls)


def arguments_emptied(parse: ParseResult) -> ParseResult:
    calls = _calls(parse, lambda a: "{}")
    return _with(parse, _edit("args_emptied", parse.tool_calls[0].arguments, "{}", arguments_emptied), tool_calls=calls)


def call_id_renumbered(parse: ParseResult) -> ParseResult:
    first = parse.tool_calls[0]
    calls = (replace(first, id="functions.get_weather:7"), *parse.tool_calls[1:])
    edit = _edit("call_id_renumbered", first.id or "", "functions.get_weather:7", call_id_renumbered)
    return _with(parse, edit, tool_calls=calls)


def last_call_dropped(parse: ParseResult) -> ParseResult:
    lost = parse.tool_calls[-1]
    edit = _edit("call_dropped", f"{lost.name}({lost.arguments})", "", last_call_dropped)
    return _with(parse, edit, tool_calls=parse.tool_calls[:-1])

