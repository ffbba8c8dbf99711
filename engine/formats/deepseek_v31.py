"""DeepSeek V3.1 output: `reasoning</think>content<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}
<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` (one line; the markers are single special tokens).

Thinking is off unless the request sets `thinking`: the generation prompt is then `<think></think>` and the model
writes no reasoning. With thinking on it ends with `<think>` and the completion starts as reasoning. A V3.1 call
carries its arguments as plain JSON after the separator, where V3 wrapped them in a ```json fence.
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

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_CALL = re.compile(f"{CALL_BEGIN}(.*?){CALL_SEP}(.*?)(?:{CALL_END}|{CALLS_END}|$)", re.S)


class DeepSeekV31Format(OutputFormat):
    family = "deepseek_v31"
    template_markers = (CALLS_BEGIN, CALL_BEGIN, CALL_SEP, CALL_END, "<think></think>")
    arguments_in_history = "mapping"  # the template applies `tojson` to them: a string would come out quoted

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        k = turn.knobs
        text, spans = reasoning_close_content(turn)
        if turn.tool_calls:
            text += CALLS_BEGIN
            for call in turn.tool_calls:
                text += f"{CALL_BEGIN}{call.name}{CALL_SEP}"
                args_start = len(text)
                text += dump_arguments(call.arguments, k.args_json)
                spans.setdefault("arguments", (args_start, len(text)))
                text += CALL_END
            text += CALLS_END
        return finish(text, spans, k, stop_token)

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        reasoning, content, calls_text = split_reasoning(text, (CALLS_BEGIN, CALL_BEGIN),
                                                         reasoning_open=reasoning_open)
        calls = tuple(ToolCall(id=None, name=m.group(1), arguments=m.group(2)) for m in _CALL.finditer(calls_text))
        return ParseResult(reasoning=reasoning, content=content, tool_calls=calls)


register(DeepSeekV31Format())
