"""Llama 3.1 / 3.3 output: plain content, or JSON tool calls `{"name": "x", "parameters": {...}}` (several joined by
`; `, the form the engines' llama3_json / llama3 parsers split), ended by `<|eot_id|>`.

Llama 3.x does not reason: a turn's reasoning is not written. The template renders an assistant turn that has tool
calls as the one call alone (`{"name": "…", "parameters": ` + arguments|tojson + `}`), without its content, and
refuses more than one call.
"""

from __future__ import annotations

import json
import re

from engine.formats.base import AssistantTurn, Completion, OutputFormat, dump_arguments, finish, register
from engine.types import ParseResult, ToolCall

# Where a call starts: the text's start or after a blank line, optionally behind the ipython tag.
_CALL_START = re.compile(r'(?:^|\n\n)(?:<\|python_tag\|>)?(?=\{"name")')


class Llama3JsonFormat(OutputFormat):
    family = "llama3_json"
    arguments_in_history = "mapping"
    template_markers = ('{"name": "', '"parameters": ', "<|eot_id|>", "<|start_header_id|>")

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text = turn.content
        spans: dict[str, tuple[int, int]] = {"content": (0, len(text))}
        if turn.tool_calls:
            text += "\n\n" if text.strip() else ""
            for i, call in enumerate(turn.tool_calls):
                text += "; " if i else ""
                text += f'{{"name": "{call.name}", "parameters": '
                args_start = len(text)
                text += dump_arguments(call.arguments, k.args_json)
                spans.setdefault("arguments", (args_start, len(text)))
                text += "}"
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        match = _CALL_START.search(text)
        if match is None:
            return ParseResult(reasoning=None, content=text)
        calls = []
        decoder = json.JSONDecoder()
        rest = text[match.end():]
        while rest:
            try:
                obj, end = decoder.raw_decode(rest)
            except json.JSONDecodeError:  # cut by max_tokens: no call the template could render, the text stays
                if not calls:
                    return ParseResult(reasoning=None, content=text)
                break
            arguments = obj.get("parameters", obj.get("arguments", {})) if isinstance(obj, dict) else {}
            name = obj.get("name", "") if isinstance(obj, dict) else ""
            calls.append(ToolCall(id=None, name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
            rest = rest[end:].removeprefix("; ")
        return ParseResult(reasoning=None, content=text[:match.start()], tool_calls=tuple(calls))


register(Llama3JsonFormat())
