"""Qwen3.5 / Qwen3.6 output: `reasoning\n</think>\n\n` then XML tool calls, as the template renders the latest turn.

The generation prompt already holds `<think>\n`, so the completion starts inside the reasoning.
"""

from __future__ import annotations

import json
import re

from engine.formats.base import (
    QWEN_NEWLINES,
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


class Qwen3XmlFormat(OutputFormat):
    family = "qwen3_xml"
    arguments_in_history = "mapping"
    template_markers = ("<tool_call>", "<function=", "<parameter=")

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn, QWEN_NEWLINES)
        for i, call in enumerate(turn.tool_calls):
            if i == 0:
                text += "\n\n" if turn.content.strip() else ""
            else:
                text += "\n"
            text += f"<tool_call>\n<function={call.name}>\n"
            args_start = len(text)
            for key, value in call.arguments.items():
                text += f"<parameter={key}>\n{dump_value(value, k.args_json)}\n</parameter>\n"
            spans.setdefault("arguments", (args_start, len(text)))
            text += "</function>\n</tool_call>"
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        reasoning, content, calls_text = split_reasoning(text, ("<tool_call>",), reasoning_open=reasoning_open)
        if reasoning is not None and "</think>" in text:
            reasoning = reasoning.removeprefix("<think>")
        calls = []
        for block in re.finditer(r"<tool_call>\n?<function=([^>\n]*)>(.*?)(?:</function>|$)", calls_text, re.S):
            args = {}
            for param in re.finditer(r"<parameter=([^>\n]*)>\n?(.*?)\n?(?:</parameter>|$)", block.group(2), re.S):
                args[param.group(1)] = param.group(2)
            calls.append(ToolCall(id=None, name=block.group(1), arguments=json.dumps(args, ensure_ascii=False)))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(Qwen3XmlFormat())
