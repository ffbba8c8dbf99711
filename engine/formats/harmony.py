"""GPT-OSS output (harmony): `<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>commentary
to=functions.x <|constrain|>json<|message|>{args}<|call|>`, or `…<|channel|>final<|message|>C<|return|>`.

The generation prompt ends with `<|start|>assistant`.
"""

from __future__ import annotations

import re

from engine.formats.base import AssistantTurn, Completion, OutputFormat, dump_arguments, finish, register
from engine.types import ParseResult, ToolCall


class HarmonyFormat(OutputFormat):
    family = "harmony"
    arguments_in_history = "string"
    template_markers = ("<|channel|>", "<|message|>", "<|call|>", "commentary")

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text = ""
        spans: dict[str, tuple[int, int]] = {}
        if turn.reasoning is not None:
            text += "<|channel|>analysis<|message|>" + "\n" * (k.reasoning_newlines_before or 0)
            start = len(text)
            text += turn.reasoning
            spans["reasoning"] = (start, len(text))
            text += "\n" * (k.reasoning_newlines_after or 0) + "<|end|><|start|>assistant"
        if turn.tool_calls:
            if turn.content:
                text += f"<|channel|>commentary<|message|>{turn.content}<|end|><|start|>assistant"
            call = turn.tool_calls[0]  # harmony emits one call per message and stops on <|call|>
            text += f"<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>"
            start = len(text)
            text += dump_arguments(call.arguments, "compact" if k.args_json == "canonical" else k.args_json)
            spans["arguments"] = (start, len(text))
            stop = "<|call|>"
        else:
            text += "<|channel|>final<|message|>"
            start = len(text)
            text += turn.content
            spans["content"] = (start, len(text))
            stop = "<|return|>"
        return finish(text, spans, k, stop)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        # Harmony names its channel in every header: reasoning_open adds nothing.
        reasoning = content = None
        calls = []
        for m in re.finditer(r"<\|channel\|>(\w+)( to=functions\.([^\s<]+))?[^<]*(?:<\|constrain\|>\w+)?<\|message\|>"
                             r"(.*?)(?=<\|end\|>|<\|call\|>|<\|return\|>|$)", text, re.S):
            channel, name, body = m.group(1), m.group(3), m.group(4)
            if name:
                calls.append(ToolCall(id=None, name=name, arguments=body))
            elif channel == "analysis":
                reasoning = body if reasoning is None else reasoning + body
            else:
                content = body if content is None else content + body
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(HarmonyFormat())
