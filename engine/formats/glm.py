"""GLM-4.5 … 5.1 output: `reasoning</think>content<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…`.

The generation prompt ends with `<think>`; a tool call stops on `<|observation|>`, an answer on `<|user|>`.
"""

from __future__ import annotations

import json
import re

from engine.formats.base import (
    AssistantTurn,
    Completion,
    OutputFormat,
    dump_value,
    finish,
    reasoning_close_content,
    register,
    split_reasoning,
)
from engine.types import ParseResult, ToolCall


class GlmFormat(OutputFormat):
    family = "glm"
    arguments_in_history = "mapping"
    template_markers = ("<tool_call>", "<arg_key>", "<arg_value>")

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn)
        for call in turn.tool_calls:
            text += f"<tool_call>{call.name}"
            args_start = len(text)
            for key, value in call.arguments.items():
                text += f"<arg_key>{key}</arg_key><arg_value>{dump_value(value, k.args_json)}</arg_value>"
            spans.setdefault("arguments", (args_start, len(text)))
            text += "</tool_call>"
        stop = "<|observation|>" if turn.tool_calls else stop_token
        return finish(text, spans, k, stop)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        reasoning, content, calls_text = split_reasoning(text, ("<tool_call>",), reasoning_open=reasoning_open)
        calls = []
        for block in re.finditer(r"<tool_call>([^<]*)(.*?)(?:</tool_call>|$)", calls_text, re.S):
            args = {m.group(1): m.group(2) for m in re.finditer(
                r"<arg_key>(.*?)</arg_key><arg_value>(.*?)(?:</arg_value>|$)", block.group(2), re.S)}
            calls.append(ToolCall(id=None, name=block.group(1), arguments=json.dumps(args, ensure_ascii=False)))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(GlmFormat())
