"""DeepSeek V3.2 / V4 output (DSML): `reasoning</think>content\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="x">\n
<｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>`.

The generation prompt ends with `<think>`. The encoder wants arguments as a JSON string and re-encodes them.
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

DSML = "｜DSML｜"


class DsmlFormat(OutputFormat):
    family = "dsml"
    arguments_in_history = "string"
    template_markers = ("｜DSML｜", "tool_calls>", "invoke name=", "parameter name=")  # V4; V3.2 writes function_calls

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn)
        if turn.tool_calls:
            text += f"\n\n<{DSML}tool_calls>\n"
            invokes = []
            for call in turn.tool_calls:
                params = "\n".join(
                    f'<{DSML}parameter name="{key}" string="{"true" if isinstance(v, str) else "false"}">'
                    f"{dump_value(v, k.args_json)}</{DSML}parameter>"
                    for key, v in call.arguments.items()
                )
                invokes.append(f'<{DSML}invoke name="{call.name}">\n{params}\n</{DSML}invoke>')
            args_start = len(text) + len(f'<{DSML}invoke name="{turn.tool_calls[0].name}">\n')
            text += "\n".join(invokes)
            spans["arguments"] = (args_start, len(text))
            text += f"\n</{DSML}tool_calls>"
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        reasoning, content, calls_text = split_reasoning(
            text, (f"\n\n<{DSML}tool_calls>", f"<{DSML}tool_calls>"), reasoning_open=reasoning_open)
        calls = []
        for invoke in re.finditer(rf'<{DSML}invoke name="([^"]*)">\n?(.*?)(?:</{DSML}invoke>|$)', calls_text, re.S):
            args: dict = {}
            param = rf'<{DSML}parameter name="([^"]*)" string="(true|false)">(.*?)(?:</{DSML}parameter>|$)'
            for p in re.finditer(param, invoke.group(2), re.S):
                if p.group(2) == "true":
                    args[p.group(1)] = p.group(3)
                else:
                    try:
                        args[p.group(1)] = json.loads(p.group(3))
                    except json.JSONDecodeError:
                        args[p.group(1)] = p.group(3)
            calls.append(ToolCall(id=None, name=invoke.group(1), arguments=json.dumps(args, ensure_ascii=False)))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=tuple(calls))


register(DsmlFormat())
