"""SGLang 0.5.23 Qwen3.5/3.6: `--reasoning-parser qwen3` with `--tool-call-parser qwen3_coder` (Qwen3CoderDetector)
or the wrong `qwen` (Qwen25Detector, JSON inside <tool_call>), which silently drops XML calls."""

from __future__ import annotations

import ast
import json
import re

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import tool_schema
from engine.types import ToolCall

REASONING = "sglang/srt/parser/reasoning_parser.py"
CODER = "sglang/srt/function_call/qwen3_coder_detector.py"
QWEN25 = "sglang/srt/function_call/qwen25_detector.py"
RANDOM_ID = "call_<uuid>"

THINK_START, THINK_END = "<think>", "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FUNCTION_RE = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
PARAMETER_RE = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)
STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


class SglangQwen3Parser(FamilyParser):
    """Reasoning (Qwen3Detector) then the chosen tool detector, as serving_chat.py chains them."""

    # qwen3_coder_detector.py lines of this release: the parameter newline trim, json.dumps, the content cut
    coder_lines = {"trim": (215, 219), "dump": 229, "content": 238}

    # ---- reasoning
    def split_reasoning(self, text: str, stream: bool, tools_active: bool, log: EditLog) -> tuple[str | None, str]:
        body = text.removeprefix(THINK_START)
        if not stream:
            while body.startswith(THINK_START):
                body = body[len(THINK_START) :]
        log.record("drop_leading_think", text, body, REASONING, 172, 173, "leading <think> tags removed")
        end = body.find(THINK_END)
        # tool_call_parser_active: <tool_call> implicitly ends reasoning
        call = body.find(CALL_START) if tools_active else -1
        if stream and call != -1 and (end == -1 or call < end):
            return body[:call] or None, body[call:]
        if end == -1:
            if call != -1:
                return body[:call] or None, body[call:]
            return body or None, ""
        return body[:end] or None, body[end + len(THINK_END) :]

    # ---- Qwen3CoderDetector value conversion (qwen3_coder_detector.py:118-176)
    def param_type(self, schema: object) -> str:
        if isinstance(schema, dict):
            declared = schema.get("type")
            if isinstance(declared, str):
                return declared.strip().lower()
            if isinstance(declared, list):
                non_null = [t for t in declared if t != "null"]
                return str(non_null[0]).strip().lower() if non_null else "string"
            if "enum" in schema:
                return "string"
        return "string"

    def convert(self, value: str, key: str, properties: dict) -> object:
        if value.lower() == "null":
            return None
        if key not in properties:
            return value
        kind = self.param_type(properties[key])
        if kind in STRING_TYPES:
            return value
        if kind.startswith(INT_PREFIXES):
            try:
                return int(value)
            except ValueError:
                return value
        if kind.startswith(("num", "float")):
            try:
                number = float(value)
            except ValueError:
                return value
            keep_float = "." in value or "e" in value.lower()
            return int(number) if not keep_float and number.is_integer() else number
        if kind in ("boolean", "bool", "binary"):
            return value.lower() == "true"
        if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
            try:
                return json.loads(value)
            except ValueError:
                pass
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return value

    def coder_calls(self, text: str, tools: list[dict], log: EditLog) -> list[ToolCall]:
        blocks = TOOL_CALL_RE.findall(text) or ([text] if "<function=" in text else [])
        calls = []
        for block in blocks:
            for closed, open_ended in FUNCTION_RE.findall(block):
                body = closed or open_ended
                if ">" not in body:
                    continue
                name, params = body[: body.index(">")], body[body.index(">") + 1 :]
                schema = tool_schema(tools, name) or {}
                properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
                values = {}
                for match in PARAMETER_RE.findall(params):
                    if ">" not in match:
                        continue
                    key, raw = match[: match.index(">")], match[match.index(">") + 1 :]
                    trimmed = raw.removeprefix("\n").removesuffix("\n")
                    log.record(
                        "param_trim_newline",
                        raw,
                        trimmed,
                        CODER,
                        *self.coder_lines["trim"],
                        f"{name}.{key}: one leading and one trailing newline removed",
                    )
                    values[key] = self.convert(trimmed, key, properties)
                arguments = json.dumps(values, ensure_ascii=False)
                log.record(
                    "args_convert_dump",
                    params,
                    arguments,
                    CODER,
                    self.coder_lines["dump"],
                    self.coder_lines["dump"],
                    f"{name}: values converted by schema (118-176) and json.dumps(ensure_ascii=False)",
                )
                calls.append(ToolCall(RANDOM_ID, name, arguments))
        return calls

    # ---- the whole turn
    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        tools_active = bool(tools) and self.tool_parser is not None
        reasoning, rest = self.split_reasoning(text, stream, tools_active, log)
        if not tools_active:
            return self.finish(reasoning, rest, (), stream)
        start = rest.find(CALL_START)
        if self.tool_parser == "qwen":
            return self.finish(reasoning, *self.wrong_parser(rest, start, stream, log), stream)
        if start == -1:
            return self.finish(reasoning, rest, (), stream)
        before = rest[:start]
        if stream:
            return self.finish(reasoning, *self.streamed(rest, start, tools, log), stream)
        calls = self.coder_calls(rest, tools, log)
        log.record(
            "content_before_calls",
            rest,
            before,
            CODER,
            self.coder_lines["content"],
            self.coder_lines["content"],
            "content is the text before the first <tool_call>; the rest is dropped",
        )
        return self.finish(reasoning, before, tuple(calls), stream)

    def streamed(self, rest: str, start: int, tools: list[dict], log: EditLog) -> tuple[str, tuple[ToolCall, ...]]:
        content, calls, position = rest[:start], [], start
        while position != -1:
            end = rest.find(CALL_END, position)
            if end == -1:
                opened = re.search(r"<function=([^>]*)>", rest[position:])
                if opened:
                    calls.append(ToolCall(RANDOM_ID, opened.group(1), ""))
                break
            calls.extend(self.coder_calls(rest[position : end + len(CALL_END)], tools, log))
            position = end + len(CALL_END)
            following = rest.find(CALL_START, position)
            content += rest[position:] if following == -1 else rest[position:following]
            position = following
        return content, tuple(calls)

    def wrong_parser(self, rest: str, start: int, stream: bool, log: EditLog) -> tuple[str, tuple[ToolCall, ...]]:
        if start == -1:
            return rest, ()
        kept = rest[:start] if stream else rest[:start].strip()
        log.record(
            "qwen25_drops_xml_call",
            rest,
            kept,
            QWEN25,
            56,
            72,
            "Qwen25Detector cannot json.loads the XML call: the call and its markup are dropped",
        )
        return kept, ()

    @staticmethod
    def finish(reasoning: str | None, content: str, calls: tuple[ToolCall, ...], stream: bool) -> ParsedTurn:
        # serving_chat.py: non-streaming content is never null; streaming sends nothing for empty text
        return ParsedTurn(reasoning, (content or None) if stream else content, calls)
