"""Qwen3.5 / Qwen3.6 output: `reasoning\n</think>\n\n` then XML tool calls, as the template renders the latest turn.

The generation prompt already holds `<think>\n`, so the completion starts inside the reasoning.
"""

from __future__ import annotations

import re

from engine.formats.base import AssistantTurn, Completion, OutputFormat, dump_value, register, truncate
from engine.types import ParseResult, ToolCall


def _newlines(value: int | None, canonical: int) -> str:
    return "\n" * (canonical if value is None else value)


class Qwen3XmlFormat(OutputFormat):
    family = "qwen3_xml"
    arguments_in_history = "mapping"

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text = ""
        spans: dict[str, tuple[int, int]] = {}
        if turn.reasoning is not None:
            text += _newlines(k.reasoning_newlines_before, 0)
            start = len(text)
            text += turn.reasoning
            spans["reasoning"] = (start, len(text))
            if k.close_think:
                text += _newlines(k.reasoning_newlines_after, 1) + "</think>" + _newlines(k.newlines_after_think, 2)
            else:
                text += _newlines(k.reasoning_newlines_after, 1)
        start = len(text)
        text += turn.content
        spans["content"] = (start, len(text))
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
        if k.truncate_in:
            start, end = spans[k.truncate_in]
            return Completion(truncate(text, start, end, k.truncate_keep), None, True)
        return Completion(text + stop_token, stop_token, False)

    def raw_parse(self, text: str) -> ParseResult:
        reasoning: str | None = None
        rest = text
        if "</think>" in text:
            reasoning, rest = text.split("</think>", 1)
            reasoning = reasoning.removeprefix("<think>")
        first_call = rest.find("<tool_call>")
        if first_call < 0:
            return ParseResult(reasoning=reasoning, content=rest)
        if reasoning is None and first_call >= 0:
            # A tool call without </think>: the reasoning ran into the call.
            reasoning, rest, first_call = rest[:first_call], rest[first_call:], 0
        content = rest[:first_call]
        calls = []
        for block in re.finditer(r"<tool_call>\n?<function=([^>\n]*)>(.*?)(?:</function>|$)", rest[first_call:], re.S):
            args = {}
            for param in re.finditer(r"<parameter=([^>\n]*)>\n?(.*?)\n?(?:</parameter>|$)", block.group(2), re.S):
                args[param.group(1)] = param.group(2)
            calls.append(ToolCall(id=None, name=block.group(1), arguments=_json(args)))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


def _json(args: dict) -> str:
    import json

    return json.dumps(args, ensure_ascii=False)


register(Qwen3XmlFormat())
