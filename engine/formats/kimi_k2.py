"""Kimi K2.x output: `reasoning</think>content<|tool_calls_section_begin|><|tool_call_begin|>functions.name:N
<|tool_call_argument_begin|>{json}<|tool_call_end|><|tool_calls_section_end|><|im_end|>`.

The generation prompt ends with `<think>`. Arguments are the model's own JSON text, which the template prints
as-is when it gets a string.
"""

from __future__ import annotations

import re

from engine.formats.base import (
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

_CALL = r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)(?:<\|tool_call_end\|>|$)"


class KimiK2Format(OutputFormat):
    family = "kimi_k2"
    arguments_in_history = "string"
    template_markers = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                        "<|tool_call_end|>")

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn)
        if turn.tool_calls:
            text += "<|tool_calls_section_begin|>"
            for i, call in enumerate(turn.tool_calls):
                call_id = call.call_id or f"functions.{call.name}:{i}"
                text += f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>"
                args_start = len(text)
                text += dump_arguments(call.arguments, k.args_json)
                spans.setdefault("arguments", (args_start, len(text)))
                text += "<|tool_call_end|>"
            text += "<|tool_calls_section_end|>"
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        reasoning, content, calls_text = split_reasoning(
            text, ("<|tool_calls_section_begin|>",), reasoning_open=reasoning_open)
        calls = [
            ToolCall(id=m.group(1), name=m.group(1).removeprefix("functions.").rsplit(":", 1)[0],
                     arguments=m.group(2))
            for m in re.finditer(_CALL, calls_text, re.S)
        ]
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(KimiK2Format())
