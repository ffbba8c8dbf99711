"""vLLM 0.33.0 Qwen3.5/3.6: `--reasoning-parser qwen3 --tool-call-parser qwen3_coder|qwen3_xml`.

Both tool names map to Qwen3EngineToolParser (vllm/parser/qwen3.py) on the declarative parser engine.
"""

from __future__ import annotations

import json
import re

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.vllm_0_33_0.schema_coercion import coerce_dict, tool_properties
from engine.types import ToolCall

QWEN3 = "vllm/parser/qwen3.py"
ENGINE = "vllm/parser/engine/parser_engine.py"
UTILS = "vllm/tool_parsers/utils.py"
RANDOM_ID = "chatcmpl-tool-<uuid>"

THINK_START, THINK_END = "<think>", "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"
FUNCTION_RE = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
FUNCTION_OPEN_RE = re.compile(r"<function=([^>\n]*)>")
PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
PARTIAL_PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*)$", re.DOTALL)


def fix_arg_types(name: str, arguments: str, tools: list[dict], log: EditLog) -> str:
    """_fix_arg_types (parser_engine.py:437-462): re-serialise the arguments only if coercing a value to the
    request's schema changed it."""
    properties = tool_properties(tools, name)
    if not properties:
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(parsed, dict):
        return arguments
    changed = coerce_dict(parsed, properties)
    if not changed:
        return arguments
    fixed = json.dumps(parsed, ensure_ascii=False)
    log.record(
        "args_schema_coerce",
        arguments,
        fixed,
        ENGINE,
        437,
        462,
        f"{name}: values coerced to the tool schema (utils.py:1153-1242) and re-dumped",
    )
    return fixed


def trim_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


class Qwen3EngineParser(FamilyParser):
    def split_reasoning(self, text: str, log: EditLog) -> tuple[str | None, str]:
        body = text
        while body.startswith(THINK_START):
            body = body[len(THINK_START) :]
        ends = [i for i in (body.find(THINK_END), body.find(CALL_START)) if i != -1]
        if not ends:
            return (body or None), ""
        cut = min(ends)
        reasoning = body[:cut]
        rest = body[cut + len(THINK_END) :] if body.startswith(THINK_END, cut) else body[cut:]
        cleaned = rest.replace(THINK_END, "").replace(THINK_START, "")
        log.record(
            "drop_stray_think_tags",
            rest,
            cleaned,
            "vllm/parser/engine/streaming_parser_engine.py",
            39,
            80,
            "special tokens outside the grammar are dropped from the text",
        )
        return (reasoning or None), cleaned

    def parse_call(self, block: str, tools: list[dict], log: EditLog, complete: bool) -> ToolCall | None:
        function = FUNCTION_RE.search(block) if complete else None
        if function is None:
            opened = FUNCTION_OPEN_RE.search(block)
            if opened is None:
                return None
            # a call cut before </tool_call> is still emitted, but its values are lost
            return ToolCall(RANDOM_ID, opened.group(1), "{}")
        name, body = function.group(1), function.group(2)
        values = {}
        for key, raw in PARAMETER_RE.findall(body):
            values[key] = trim_one_newline(raw)
            log.record(
                "param_trim_newline",
                raw,
                values[key],
                QWEN3,
                61,
                67,
                f"{name}.{key}: one leading and one trailing newline removed",
            )
        arguments = json.dumps(values, ensure_ascii=False)
        return ToolCall(RANDOM_ID, name, fix_arg_types(name, arguments, tools, log))

    def streamed_partial_call(self, block: str) -> ToolCall | None:
        opened = FUNCTION_OPEN_RE.search(block)
        if opened is None:
            return None
        body = block[opened.end() :]
        arguments = ""
        complete = PARAMETER_RE.findall(body)
        for position, (key, raw) in enumerate(complete):
            arguments += ("{" if position == 0 else ", ") + f"{json.dumps(key)}: {json.dumps(trim_one_newline(raw))}"
        partial = PARTIAL_PARAMETER_RE.search(body.split("</parameter>")[-1])
        if partial is not None:
            value = partial.group(2).removeprefix("\n")
            prefix = "{" if not complete else ", "
            arguments += (
                prefix
                + f"{json.dumps(partial.group(1), ensure_ascii=False)}: "
                + json.dumps(value, ensure_ascii=False)[:-1]
            )
        return ToolCall(RANDOM_ID, opened.group(1), arguments)

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        reasoning, rest = self.split_reasoning(text, log)
        start = rest.find(CALL_START)
        if start == -1:
            return ParsedTurn(reasoning, rest or None, ())
        before = rest[:start]
        calls: list[ToolCall] = []
        between: list[str] = []
        position = start
        trailing = ""
        while True:
            end = rest.find(CALL_END, position)
            block = rest[position + len(CALL_START) : end if end != -1 else len(rest)]
            if end == -1:
                call = self.streamed_partial_call(block) if stream else self.parse_call(block, tools, log, False)
                if call is not None:
                    calls.append(call)
                break
            call = self.parse_call(block, tools, log, True)
            if call is not None:
                calls.append(call)
            position = end + len(CALL_END)
            following = rest.find(CALL_START, position)
            if following == -1:
                trailing = rest[position:]
                break
            between.append(rest[position:following])
            position = following
        if not calls:
            log.record(
                "drop_unparsed_markup", rest, before, ENGINE, 855, 894, "an unfinished tool-call block is dropped"
            )
            return ParsedTurn(reasoning, before or None, ())
        if stream:
            content = ("" if not before.strip() else before) + "".join(b for b in between if b.strip()) + trailing
            return ParsedTurn(reasoning, content or None, tuple(calls))
        log.record(
            "drop_text_after_call",
            rest[start:],
            rest[start : len(rest) - len(trailing)],
            ENGINE,
            855,
            856,
            "text after the last tool call is deferred and never returned by parse()",
        )
        stripped = before.strip()
        log.record(
            "content_strip", before, stripped, ENGINE, 488, 498, "content stripped because tool calls are present"
        )
        return ParsedTurn(reasoning, stripped or None, tuple(calls))
