"""MiniMax M2.x output: `reasoning\n</think>\n\ncontent\n<minimax:tool_call>\n<invoke name="x">\n<parameter name="k">v
</parameter>\n</invoke>\n</minimax:tool_call>`, as the M2.x templates render the latest assistant turn.

The generation prompt ends with `<think>\n`, so the completion starts inside the reasoning. String values are written
as they are, every other value as JSON (the template's `tojson(ensure_ascii=False) if v is not string else v`).
The engines' `minimax_m2_append_think` / `minimax-append-think` reasoning parsers return the think block inside the
content, which the template splits off again at `</think>`.
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

CALLS_OPEN, CALLS_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"


class MinimaxXmlFormat(OutputFormat):
    family = "minimax_xml"
    arguments_in_history = "mapping"
    template_markers = (CALLS_OPEN, "<invoke name=", "<parameter name=")

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn, QWEN_NEWLINES)  # MiniMax writes Qwen's newlines
        if turn.tool_calls:
            text += f"\n{CALLS_OPEN}\n"
            for call in turn.tool_calls:
                text += f'<invoke name="{call.name}">\n'
                args_start = len(text)
                for key, value in call.arguments.items():
                    text += f'<parameter name="{key}">{dump_value(value, k.args_json)}</parameter>\n'
                spans.setdefault("arguments", (args_start, len(text)))
                text += "</invoke>\n"
            text += CALLS_CLOSE
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        # The delimiters are the template's own, whitespace included: `\n</think>\n\n` and `\n<minimax:tool_call>`
        # (the template prints a string reasoning_content and the content between them as they are).
        reasoning, content, calls_text = split_reasoning(text, (CALLS_OPEN,), reasoning_open=reasoning_open)
        if reasoning is not None and "</think>" in text:
            reasoning = reasoning.removeprefix("<think>").removesuffix("\n")
            content = content.removeprefix("\n\n")
        if calls_text:
            content = content.removesuffix("\n")
        calls = []
        for block in re.finditer(r'<invoke name="([^"]*)">\n?(.*?)(?:</invoke>|$)', calls_text, re.S):
            args = {param.group(1): param.group(2)
                    for param in re.finditer(r'<parameter name="([^"]*)">(.*?)(?:</parameter>|$)', block.group(2),
                                             re.S)}
            calls.append(ToolCall(id=None, name=block.group(1), arguments=json.dumps(args, ensure_ascii=False)))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(MinimaxXmlFormat())
