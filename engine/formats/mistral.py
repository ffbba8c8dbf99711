"""Mistral (Small 3.2, tokenizer v11+) output: content, then `[TOOL_CALLS]name[ARGS]{json}` for each call, ended by
`</s>`.

Mistral Small 3.2 does not reason: a turn's reasoning is not written. The model writes no call id; its template
renders one in history (`[TOOL_CALLS]name[CALL_ID]id[ARGS]…`, the id must be 9 alphanumerics) and drops the content
of an assistant turn that has tool calls.
"""

from __future__ import annotations

import json

from engine.formats.base import AssistantTurn, Completion, OutputFormat, dump_arguments, finish, register
from engine.types import ParseResult, ToolCall

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class MistralFormat(OutputFormat):
    family = "mistral"
    arguments_in_history = "mapping"
    template_markers = (TOOL_CALLS, ARGS, "[INST]")

    @staticmethod
    def client_call_id(index: int) -> str:
        # The template refuses every id but 9 alphanumerics (mistral-common's rule), as vLLM's mistral parser makes.
        return f"call{index:05d}"

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text = turn.content
        spans: dict[str, tuple[int, int]] = {"content": (0, len(text))}
        for call in turn.tool_calls:
            text += f"{TOOL_CALLS}{call.name}{ARGS}"
            args_start = len(text)
            text += dump_arguments(call.arguments, k.args_json)
            spans.setdefault("arguments", (args_start, len(text)))
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        content, _, calls_text = text.partition(TOOL_CALLS)
        calls = []
        if calls_text:
            for block in calls_text.split(TOOL_CALLS):
                head, _, arguments = block.partition(ARGS)
                name, _, call_id = head.partition(CALL_ID)
                try:
                    arguments = json.dumps(json.loads(arguments), ensure_ascii=False)
                except json.JSONDecodeError:  # cut by max_tokens: kept as the text it is
                    pass
                calls.append(ToolCall(id=call_id or None, name=name, arguments=arguments))
        return ParseResult(reasoning=None, content=content, tool_calls=tuple(calls))


register(MistralFormat())
