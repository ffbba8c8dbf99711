"""Hermes-style output (Qwen2.5, Qwen3-2507, QwQ): content, then JSON calls each in `<tool_call>\n…\n</tool_call>`.

    Sure.\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>

One newline separates the content from the first call and each call from the next, as the templates render history
(Qwen2.5: `'\n' + content` then `'\n<tool_call>\n{"name": "'`). A thinking variant writes `reasoning\n</think>\n\n`
first, as Qwen3's thinking templates render the latest turn.
"""

from __future__ import annotations

import json
import re

from engine.formats.base import (
    QWEN_NEWLINES,
    AssistantTurn,
    Completion,
    OutputFormat,
    dump_arguments,
    finish,
    reasoning_close_content,
    register,
    split_reasoning,
)
from engine.types import ParseResult, ToolCall

_CALL = re.compile(r"<tool_call>\n?(.*?)(?:\n?</tool_call>|$)", re.S)
_WRITTEN = re.compile(r'\{"name": "([^"\n]*)", "arguments": (.*)\}', re.S)  # a call exactly as the writer writes it
_NAME = re.compile(r'"name":\s*"([^"\n]*)"')


class HermesFormat(OutputFormat):
    family = "hermes"
    template_markers = ("<tool_call>", '{"name": "', '"arguments": ')
    arguments_in_history = "mapping"  # Qwen2.5's template applies `tojson` to them whatever they are

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn, QWEN_NEWLINES)
        for i, call in enumerate(turn.tool_calls):
            text += "\n" if i or turn.content else ""
            text += f'<tool_call>\n{{"name": "{call.name}", "arguments": '
            args_start = len(text)
            text += dump_arguments(call.arguments, k.args_json)
            spans.setdefault("arguments", (args_start, len(text)))
            text += "}\n</tool_call>"
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        reasoning, content, calls_text = split_reasoning(text, ("<tool_call>",), reasoning_open=reasoning_open)
        if calls_text and content.strip("\n") and content.endswith("\n"):
            content = content[:-1]  # the newline the template writes between the content and the first call
        calls = []
        for block in _CALL.finditer(calls_text):
            body = block.group(1)
            written = _WRITTEN.fullmatch(body)
            if written:  # the arguments' own bytes, whatever their spacing
                calls.append(ToolCall(id=None, name=written.group(1), arguments=written.group(2)))
                continue
            try:
                call = json.loads(body)
                name, arguments = str(call["name"]), json.dumps(call.get("arguments", {}), ensure_ascii=False)
            except (json.JSONDecodeError, KeyError, TypeError):  # cut by max_tokens: what follows "arguments"
                found = _NAME.search(body)
                name = found.group(1) if found else ""
                arguments = body.partition('"arguments": ')[2]
            calls.append(ToolCall(id=None, name=name, arguments=arguments))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(HermesFormat())
