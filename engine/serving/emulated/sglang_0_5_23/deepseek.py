"""SGLang 0.5.23 DeepSeek DSML: `--reasoning-parser deepseek-v4 --tool-call-parser deepseekv4` (V4) and the V3.2 tool
parser `deepseekv32` (same detector, `function_calls` block).

Reasoning: DeepSeekV4Detector (parser/reasoning_parser.py:1543-1562) is the base <think>/</think> detector with no
tool-start token; `deepseek-v3` is Qwen3Detector (441-485), whose <tool_call> also ends reasoning. Tools:
DeepSeekV32Detector (function_call/deepseekv32_detector.py) with V4's block name (deepseekv4_detector.py:60).
The serving glue (reasoning first, then the tool detector on what is left; streaming deltas accumulated) is that of
tests/conformance/oracle_runner.py, which mirrors serving_chat.py. Streaming is emulated chunk by chunk: the
detectors are buffer state machines whose output depends on where chunks split.

`force_reasoning`: as the server decides it for a model without a chat template's reasoning config
(serving_chat.py:3518-3572): `deepseek-v3` (_DeepSeekV3Detector, reasoning_default "explicit_thinking",
reasoning_parser.py:1529-1534) only when the request sets `thinking: true` in chat_template_kwargs, so DeepSeek V3.2
with thinking off gets its answer and calls back; `deepseek-v4` always, as the golden corpus runs it (thinking on).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import tool_schema
from engine.serving.emulated.sglang_0_5_23.reasoning import ReasoningDetector
from engine.types import ToolCall

REASONING = "sglang/srt/parser/reasoning_parser.py"
DETECTOR = "sglang/srt/function_call/deepseekv32_detector.py"
BASE_DETECTOR = "sglang/srt/function_call/base_format_detector.py"
PARSER = "sglang/srt/function_call/function_call_parser.py"
SERVING_CHAT = "sglang/srt/entrypoints/openai/serving_chat.py"
RANDOM_ID = "call_<uuid>"

THINK_START, THINK_END = "<think>", "</think>"
DSML = "｜DSML｜"


class _RejectedConstant(ValueError):
    """json.loads(parse_constant=_reject_json_constant): NaN / Infinity are refused (deepseekv32_detector.py:17)."""


def _reject_constant(value: str) -> object:
    raise _RejectedConstant(f"Invalid JSON constant: {value}")


# ---------------------------------------------------------------- tools (DeepSeekV32Detector)
@dataclass
class Item:
    """One ToolCallItem: a call's name (first item only) and a piece of its JSON arguments."""

    index: int
    name: str | None
    parameters: str


@dataclass(frozen=True)
class Invoke:
    """One invoke_regex match: where it is, the raw name, the body, and whether </invoke> (or />) closed it."""

    start: int
    end: int
    raw_name: str
    body: str
    complete: bool

    @property
    def name(self) -> str:
        return self.raw_name.strip()


@dataclass(frozen=True)
class Parameter:
    """One parameter_regex match: its span, the name, the string="..." flag and the raw value."""

    start: int
    end: int
    key: str
    kind: str
    raw: str


@dataclass
class DsmlDetector:
    """deepseekv32_detector.py:21-383 (0.5.23); `block` is "function_calls" (V3.2) or "tool_calls" (V4)."""

    block: str
    log: EditLog
    buffer: str = ""
    current_tool_id: int = -1
    prev_tool_call_arr: list[dict] = field(default_factory=list)
    streamed_args_for_tool: list[str] = field(default_factory=list)
    noted: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.bot = f"<{DSML}{self.block}>"
        self.eot = f"</{DSML}{self.block}>"
        self.invoke_start = f"<{DSML}invoke"
        self.invoke_end = f"</{DSML}invoke>"
        parameter = f"{DSML}parameter"
        self.parameter_head_re = re.compile(rf'<{parameter}\s+name="([^"]+)"\s+string="([^"]+)"\s*>')
        self.parameter_close = f"</{parameter}>"
        self.invoke_head_re = re.compile(rf'<{DSML}invoke\s+name="(?P<name>[^"]+)"\s*(?:(?P<self_close>/>)|>)')

    # The detector's regexes `<block>(.*?)</block>` and `<invoke name="x">(?P<body>.*?)(</invoke>|$)` (92, 96-100)
    # are matched with str.find: the same matches, without re-scanning to the end of a 1 MB text from every
    # unclosed opener (which made one parse quadratic).
    def blocks(self, text: str) -> list[str]:
        """re.findall of `<block>(.*?)</block>` (DOTALL)."""
        found, position = [], 0
        while (start := text.find(self.bot, position)) != -1:
            end = text.find(self.eot, start + len(self.bot))
            if end == -1:
                break
            found.append(text[start + len(self.bot) : end])
            position = end + len(self.eot)
        return found

    def find_invoke(self, text: str, position: int = 0) -> Invoke | None:
        """re.search of invoke_regex: the body runs lazily to </invoke>, or to `$` (the end, or before a final
        newline) when the closer has not arrived."""
        head = self.invoke_head_re.search(text, position)
        if head is None:
            return None
        name = head.group("name")
        if head.group("self_close"):
            return Invoke(head.start(), head.end(), name, "", True)
        close = text.find(self.invoke_end, head.end())
        if close != -1:
            return Invoke(head.start(), close + len(self.invoke_end), name, text[head.end() : close], True)
        end = len(text) - 1 if text.endswith("\n") else len(text)
        return Invoke(head.start(), end, name, text[head.end() : end], False)

    def parameter_matches(self, body: str) -> list[Parameter]:
        """re.finditer of parameter_regex `<parameter name="k" string="t">(.*?)</parameter>` (89-91)."""
        found, position = [], 0
        while (head := self.parameter_head_re.search(body, position)) is not None:
            close = body.find(self.parameter_close, head.end())
            if close == -1:
                break  # no later opener can find a closer either
            position = close + len(self.parameter_close)
            found.append(Parameter(head.start(), position, head.group(1), head.group(2), body[head.end() : close]))
        return found

    def invokes(self, text: str) -> list[Invoke]:
        """re.finditer of invoke_regex."""
        found, position = [], 0
        while (match := self.find_invoke(text, position)) is not None:
            found.append(match)
            position = match.end
        return found

    def has_tool_call(self, text: str) -> bool:
        return self.bot in text or self.invoke_start in text

    def note(self, step: str, before: str, after: str, line: int, end_line: int, description: str) -> None:
        """Record an edit of this detector once (streaming re-parses the same invoke on every chunk)."""
        key = (step, before, after)
        if before != after and key not in self.noted:
            self.noted.add(key)
            self.log.record(step, before, after, DETECTOR, line, end_line, description)

    def text_before_dsml(self, text: str) -> str:
        """deepseekv32_detector.py:107-117: prose before the first DSML tag, minus the template's blank line."""
        index = text.find(DSML)
        if index == -1:
            return text
        if index >= 2 and text[index - 2 : index] == "</":
            index -= 2
        elif index >= 1 and text[index - 1] == "<":
            index -= 1
        return text[:index].removesuffix("\n\n")

    def parameters(self, body: str, name: str) -> str:
        """deepseekv32_detector.py:133-193: a direct JSON object, or the parameter tags (string values stripped,
        others json.loads-ed); raises ValueError for a malformed invoke."""
        stripped = body.strip()
        if stripped.startswith("{"):
            parsed = json.loads(stripped, parse_constant=_reject_constant)
            if not isinstance(parsed, dict):
                raise ValueError("DeepSeek tool arguments must be a JSON object")
            return stripped
        values: dict[str, object] = {}
        leftover, last_end = [], 0
        matches = self.parameter_matches(body)
        for match in matches:
            leftover.append(body[last_end : match.start])
            key, kind, raw = match.key, match.kind, match.raw
            last_end = match.end
            if kind == "true":
                values[key] = raw.strip()
                self.note("param_value_strip", raw, raw.strip(), 171, 176, f"{name}.{key}: string value .strip()")
            else:
                try:
                    values[key] = json.loads(raw.strip(), parse_constant=_reject_constant)
                except ValueError:
                    values[key] = raw.strip()
        leftover.append(body[last_end:])
        rest = "".join(leftover)
        if DSML in rest or (not matches and rest.strip()):
            raise ValueError("Malformed DeepSeek tool parameter")
        return json.dumps(values, ensure_ascii=False)

    def detect_and_parse(self, text: str, tools: list[dict]) -> tuple[str, list[tuple[str, str]]]:
        """deepseekv32_detector.py:195-250: (text before the block, calls as (name, JSON arguments))."""
        start = text.find(self.bot)
        if start != -1:
            normal = text[:start].removesuffix("\n\n")
            sections = self.blocks(text)
        else:
            invoke = text.find(self.invoke_start)
            if invoke == -1:
                return text, []
            normal = self.text_before_dsml(text)
            sections = [text[invoke:]]
        if not sections:
            return normal, []
        calls: list[tuple[str, str]] = []
        try:
            for section in sections:
                for match in self.invokes(section):
                    name, body = match.name, match.body
                    if not match.complete:
                        self.note("drop_unclosed_invoke", body, "", 229, 233, f"{name}: the invoke has no </invoke>")
                        continue
                    try:
                        arguments = self.parameters(body, name)
                    except ValueError:
                        self.note("drop_malformed_invoke", body, "", 234, 238, f"{name}: malformed parameters")
                        continue
                    calls.extend(self.base_json(name, json.loads(arguments), tools, body))
        except Exception:  # deepseekv32_detector.py:247-250: fail closed, keep the prose
            return normal, calls
        return normal, calls

    def base_json(self, name: str, parameters: object, tools: list[dict], body: str) -> list[tuple[str, str]]:
        """base_format_detector.py:77-101 parse_base_json: undeclared names are dropped; arguments re-dumped."""
        if not name or tool_schema(tools, name) is None:
            self.log.record("drop_undeclared_tool", name, "", BASE_DETECTOR, 84, 88, f"{name!r} is not a declared tool")
            return []
        dumped = json.dumps(parameters or {}, ensure_ascii=False)
        self.log.record(
            "args_dsml_to_json",
            body,
            dumped,
            BASE_DETECTOR,
            90,
            97,
            f"{name}: parameters read by _parse_parameters_from_xml, then json.dumps(ensure_ascii=False)",
        )
        return [(name, dumped)]

    # ---- streaming (deepseekv32_detector.py:252-383)
    def stream(self, new_text: str) -> tuple[str, list[Item]]:
        self.buffer += new_text
        current = self.buffer
        bar = DSML[0]
        dsml_like = any(marker in current for marker in (DSML, f"<{bar}", f"</{bar}"))
        tail = current.rstrip()
        prefix_tail = any(tail.endswith(p) for p in ("<", f"<{bar}", "</", f"</{bar}"))
        if not self.has_tool_call(current) and not dsml_like and not prefix_tail:
            # trailing whitespace may be the blank line before a block: held back (279-289)
            stripped = current.rstrip()
            if not stripped:
                return "", []
            self.buffer = current[len(stripped) :]
            for token in (self.eot, self.invoke_end):
                stripped = stripped.replace(token, "")
            return stripped, []
        items: list[Item] = []
        preamble = ""
        try:
            while True:
                match = self.find_invoke(current)
                if match is None or not match.complete:
                    break
                name, body = match.name, match.body
                if self.current_tool_id == -1:
                    self.current_tool_id = 0
                    self.prev_tool_call_arr, self.streamed_args_for_tool = [], []
                    call_start = match.start
                    bot = current.rfind(self.bot, 0, call_start)
                    preamble = current[: bot if bot != -1 else call_start].removesuffix("\n\n")
                try:
                    arguments = self.parameters(body, name)
                except ValueError:
                    self.buffer = current = current[match.end :]
                    continue
                while len(self.prev_tool_call_arr) <= self.current_tool_id:
                    self.prev_tool_call_arr.append({})
                while len(self.streamed_args_for_tool) <= self.current_tool_id:
                    self.streamed_args_for_tool.append("")
                items.append(Item(self.current_tool_id, name, arguments))
                self.note("args_dsml_to_json", body, arguments, 327, 349, f"{name}: streamed as parsed, not re-dumped")
                self.streamed_args_for_tool[self.current_tool_id] = arguments
                self.prev_tool_call_arr[self.current_tool_id] = {"name": name, "arguments": arguments}
                self.buffer = current = current[match.end :]
                self.current_tool_id += 1
            return preamble, items
        except Exception:  # 365-372: fail closed, never surface DSML
            self.buffer = ""
            if self.current_tool_id == -1:
                preamble = self.text_before_dsml(current)
            return preamble, items

    def finish(self) -> str:
        """deepseekv32_detector.py:374-383: held text is released without its DSML, or dropped after a call."""
        held, self.buffer = self.buffer, ""
        if not held or self.current_tool_id != -1:
            return ""
        return self.text_before_dsml(held)


# ---------------------------------------------------------------- the serving glue
TOOL_BLOCKS = {"deepseekv4": "tool_calls", "deepseekv32": "function_calls"}


class SglangDeepSeekParser(FamilyParser):
    """ReasoningParser then FunctionCallParser, as serving_chat.py chains them (see oracle_runner.run_sglang)."""

    version = "0.5.23"
    detector_class: type = DsmlDetector
    think_detector_class: type[ReasoningDetector] = ReasoningDetector
    content_lines = (203, 217)
    content_note = "content is the text before the DSML block (its trailing blank line removed); the rest is dropped"
    stream_lines = (252, 383)

    @property
    def force_reasoning(self) -> bool:
        if self.reasoning_parser == "deepseek-v3":
            return (self.chat_template_kwargs or {}).get("thinking") is True
        return True

    def _tool_start(self) -> str | None:
        # deepseek-v3 is Qwen3Detector (reasoning_parser.py:479: "<tool_call>" ends reasoning); V4 has none
        return "<tool_call>" if self.reasoning_parser == "deepseek-v3" else None

    def _check_supported(self) -> None:
        if self.tool_parser in ("deepseekv3", "deepseekv31"):
            raise NotImplementedError(
                f"{self.tool_parser}: not emulated: the V3/V3.1 format (JSON arguments between "
                "<｜tool▁call▁begin｜> special tokens, deepseekv3_detector.py / deepseekv31_detector.py) is not DSML"
            )
        if self.tool_parser is not None and self.tool_parser not in TOOL_BLOCKS:
            raise ValueError(
                f"sglang {self.version} has no tool-call parser {self.tool_parser!r} "
                f"({PARSER} ToolCallParserEnum raises 'Unsupported tool_call_parser'); use deepseekv4 or deepseekv32"
            )
        if self.reasoning_parser not in (None, "deepseek-v3", "deepseek-v4"):
            raise NotImplementedError(f"{self.reasoning_parser}: not emulated together with a DeepSeek tool parser")

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        self._check_supported()
        if stream:
            return self._parse_stream(tools, chunks, log)
        return self._parse_whole(text, tools, log)

    def _think(self, stream: bool, log: EditLog) -> ReasoningDetector | None:
        if self.reasoning_parser is None:
            return None
        return self.think_detector_class(self._tool_start(), self.force_reasoning, stream, log)

    def _detector(self, log: EditLog) -> DsmlDetector | None:
        if self.tool_parser is None:
            return None
        return self.detector_class(TOOL_BLOCKS[self.tool_parser], log)

    # ---- non-streaming (serving_chat.py: reasoning, then tools on the remaining text)
    def _parse_whole(self, text: str, tools: list[dict], log: EditLog) -> ParsedTurn:
        reasoning = None
        think = self._think(False, log)
        if think is not None:
            reasoning, text = think.detect_and_parse(text)
        calls: list[ToolCall] = []
        detector = self._detector(log)
        if detector is not None and tools and detector.has_tool_call(text):
            try:
                remaining, found = self.non_stream_tools(detector, text, tools)
            except Exception:  # serving_chat.py: a failing tool parse is logged and the text kept
                remaining, found = text, []
            log.record("content_before_tool_block", text, remaining, DETECTOR, *self.content_lines, self.content_note)
            text = remaining
            calls = [ToolCall(RANDOM_ID, name, arguments) for name, arguments in found]
        return ParsedTurn(reasoning or None, text or "", tuple(calls))

    def non_stream_tools(self, detector: DsmlDetector, text: str, tools: list[dict]) -> tuple[str, list]:
        """function_call_parser.py:183-221 parse_non_stream: the detector's text once it saw a call marker."""
        has_call = detector.has_tool_call(text)
        normal, calls = detector.detect_and_parse(text, tools)
        return (normal, calls) if calls or has_call else (text, [])

    # ---- streaming (oracle_runner.run_sglang, serving_chat.py:3300-3340 and the tool-call stream)
    def _parse_stream(self, tools: list[dict], chunks: list[str], log: EditLog) -> ParsedTurn:
        think = self._think(True, log)
        detector = self._detector(log) if tools else None
        reasoning_out, content_out, normal_in = "", "", ""
        calls: dict[int, dict[str, str | None]] = {}
        for position, chunk in enumerate(chunks):
            finished = position == len(chunks) - 1
            delta = chunk
            if think is not None:
                reasoning, delta = think.stream(chunk)
                if finished:  # ReasoningParser.parse_stream_end
                    end_reasoning, end_normal = think.finish()
                    reasoning += end_reasoning
                    delta += end_normal
                reasoning_out += reasoning
            if detector is None:
                content_out += delta
                continue
            normal_in += delta
            normal, items = detector.stream(delta)
            if finished:  # FunctionCallParser.parse_stream_end
                normal += detector.finish()
            content_out += normal
            for item in items:
                entry = calls.setdefault(item.index, {"id": None, "name": "", "arguments": ""})
                if item.name:
                    entry["id"] = entry["id"] or RANDOM_ID
                    entry["name"] = (entry["name"] or "") + item.name
                entry["arguments"] = (entry["arguments"] or "") + item.parameters
            if finished:
                self._unstreamed_arguments(detector, calls, log)
        if detector is not None:
            log.record(
                "stream_content_without_dsml",
                normal_in,
                content_out,
                DETECTOR,
                *self.stream_lines,
                "the tool detector streams only the prose around the DSML; the markup is withheld",
            )
        turn_calls = tuple(
            ToolCall(calls[i]["id"], str(calls[i]["name"]), str(calls[i]["arguments"])) for i in sorted(calls)
        )
        return ParsedTurn(reasoning_out or None, content_out or None, turn_calls)

    def _unstreamed_arguments(self, detector: DsmlDetector, calls: dict[int, dict[str, str | None]],
                              log: EditLog) -> None:
        """serving_chat.py _check_for_unstreamed_tool_args (3793-3805): the last call's arguments not yet sent are
        appended (a string as it is, anything else JSON-dumped; only what extends what was streamed)."""
        previous, streamed = detector.prev_tool_call_arr, detector.streamed_args_for_tool
        if not previous or not streamed:
            return
        index = len(previous) - 1
        if index >= len(streamed):
            return
        remaining = self.unstreamed_remainder(previous[index].get("arguments", {}), streamed[index])
        if remaining:
            entry = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
            before = entry["arguments"] or ""
            entry["arguments"] = before + remaining
            log.record("unstreamed_arguments", before, entry["arguments"], SERVING_CHAT, *self.unstreamed_lines,
                       "the arguments the stream had not sent yet are sent when it ends")

    unstreamed_lines = (3793, 3805)

    @staticmethod
    def unstreamed_remainder(expected: object, actual: str) -> str:
        expected_call = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        return expected_call[len(actual) :] if expected_call.startswith(actual) else ""
