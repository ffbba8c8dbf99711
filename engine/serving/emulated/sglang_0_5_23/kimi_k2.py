"""SGLang 0.5.23 Kimi K2.x: `--reasoning-parser kimi_k2 --tool-call-parser kimi_k2`.

Reasoning: KimiK2Detector (sglang/srt/parser/reasoning_parser.py:516-557 over the base class 66-364), forced on
because the prompt ends with `<think>`; `<|tool_calls_section_begin|>` also ends reasoning when no `</think>` came.
Tools: KimiK2Detector (sglang/srt/function_call/kimik2_detector.py) through FunctionCallParser, chained as
serving_chat.py chains them (the oracle's glue, tests/conformance/oracle_runner.py). Nothing is stripped; the
arguments are the model's raw JSON text; content is the text before the section (non-streaming) but keeps the text
after it when streaming. Call ids are rebuilt by the serving layer as `functions.<name>:<history + position>`
(serving_chat.py:3129-3147), not taken from the model's header.

Streaming is emulated chunk by chunk, since the detectors hold back partial tokens and the result depends on where
chunks end. A growing in-flight call is kept in a `Growing` buffer so a long call stays linear in its length.
"""

from __future__ import annotations

import json
import re
import sys
from bisect import bisect_right
from dataclasses import dataclass

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import keep_special_tokens_whole, partial_token_length, schema_properties
from engine.types import ToolCall

REASONING = "sglang/srt/parser/reasoning_parser.py"
DETECTOR = "sglang/srt/function_call/kimik2_detector.py"
SERVING = "sglang/srt/entrypoints/openai/serving_chat.py"
BASE_DETECTOR = "sglang/srt/function_call/base_format_detector.py"

THINK_START, THINK_END = "<think>", "</think>"
SECTION_START, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_START, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARG_START = "<|tool_call_argument_begin|>"
TOOL_TOKENS = (SECTION_START, SECTION_END, CALL_START, CALL_END, ARG_START)  # kimik2_detector.py:22-28
# The tokenizer's special tokens the oracle registered (tests/conformance/corpus.py): one id each, so a detokenized
# delta never splits one.
SPECIAL_TOKENS = (THINK_START, THINK_END, *TOOL_TOKENS, "<|im_end|>")

CALL_ID_RE = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")  # kimik2_detector.py:85-87
COUNTER_RE = re.compile(r"^\d+$")  # kimik2_detector.py:89
DIGITS = re.compile(r"[0-9]+")
DEEP_NESTING = 500  # below any interpreter's recursion limit for json.loads, so deeper texts go to the real parser
STRING_STOP = re.compile(r'["\\]')
STRUCTURE = re.compile(r'["{}\[\]]')

# Where each recorded step lives at this version: (path, first line, last line).
LINES = {
    "drop_leading_think": (REASONING, 171, 173),
    "drop_think_start": (REASONING, 240, 246),
    "args_ws_trim": (DETECTOR, 71, 74),
    "drop_unrecognized_call": (DETECTOR, 188, 192),
    "content_before_section": (DETECTOR, 205, 206),
    "strip_tool_tokens": (DETECTOR, 33, 37),
    "drop_malformed_call": (DETECTOR, 245, 261),
    "drop_unrecognized_call_stream": (DETECTOR, 283, 293),
    "drop_buffer_on_error": (DETECTOR, 353, 360),
    "drop_unflushed_buffer": (BASE_DETECTOR, 353, 359),
    "tool_detector_stream": (DETECTOR, 212, 360),
    "args_unstreamed_tail": (SERVING, 3788, 3805),
    "call_id_rebuilt": (SERVING, 3129, 3147),
}


class DetectorFailure(Exception):
    """Where the real detector raises outside its own narrow except clauses (e.g. .keys() on a JSON list)."""


# ---------------------------------------------------------------- small text helpers
def strip_tool_tokens(text: str) -> str:
    """_strip_special_tokens (kimik2_detector.py:33-37)."""
    for token in TOOL_TOKENS:
        text = text.replace(token, "")
    return text


def split_pending_start(text: str) -> tuple[str, str]:
    """_split_pending_start (kimik2_detector.py:388-399): hold a tail of 2+ characters that may start a marker."""
    for size in range(min(len(text), len(SECTION_START) - 1), 1, -1):
        tail = text[-size:]
        if SECTION_START.startswith(tail) or CALL_START.startswith(tail):
            return text[:-size], tail
    return text, ""


def is_id_char(char: str) -> bool:
    return not char.isspace() and char not in "<|"


class Growing:
    """Append-only text with memoised first-occurrence searches, so a long in-flight call costs O(new text) per
    chunk instead of rescanning (and recopying) the whole buffer."""

    def __init__(self, text: str = "") -> None:
        self.parts: list[str] = [text] if text else []
        self.starts: list[int] = [0] if text else []
        self.length = len(text)
        self.memo: dict[tuple[str, int], tuple[int, int]] = {}
        self.last_lt = text.rfind("<")  # every Kimi marker starts with "<": no later "<", no new occurrence

    def append(self, text: str) -> None:
        if text:
            lt = text.rfind("<")
            if lt != -1:
                self.last_lt = self.length + lt
            self.starts.append(self.length)
            self.parts.append(text)
            self.length += len(text)

    def slice(self, start: int, end: int | None = None) -> str:
        end = self.length if end is None else min(end, self.length)
        start = max(start, 0)
        if start >= end:
            return ""
        part = bisect_right(self.starts, start) - 1
        pieces = []
        position = start
        while position < end:
            offset = self.starts[part]
            pieces.append(self.parts[part][position - offset : end - offset])
            position = offset + len(self.parts[part])
            part += 1
        return "".join(pieces)

    def text(self) -> str:
        return self.slice(0)

    def find(self, token: str, start: int = 0) -> int:
        found, searched = self.memo.get((token, start), (-1, start))
        if found == -1:
            low = max(start, searched - len(token) + 1)
            possible = self.length - low >= len(token) and (self.last_lt >= low or not token.startswith("<"))
            index = self.slice(low).find(token) if possible else -1
            found = low + index if index != -1 else -1
            self.memo[(token, start)] = (found, self.length)
        return found


class JsonPrefix:
    """Whether a growing text can be parsed by json.loads yet, without parsing it again on every chunk.

    An unclosed object, array or string cannot; one closed and followed by anything but whitespace never will.
    Only a closed value (or a bare scalar) is handed to the real parser, and a closed value's verdict is kept."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.kind = ""  # "", "container", "string", "scalar", "closed", "trailing"
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.verdict: tuple[bool, object] | None = None
        # json.loads can fail with something other than a syntax error before it reaches the unclosed end: too
        # deep a nesting (RecursionError) or an integer longer than int's digit limit (ValueError). Then the
        # real parser is asked, whatever the shape.
        self.deepest = 0
        self.digit_run = 0
        self.longest_digits = 0

    def extend(self, more: str) -> None:
        self.parts.append(more)
        runs = DIGITS.findall(more)
        if runs:
            leading = len(more) - len(more.lstrip("0123456789"))
            self.longest_digits = max(self.longest_digits, self.digit_run + leading, *map(len, runs))
            trailing = len(more) - len(more.rstrip("0123456789"))
            self.digit_run = trailing if leading < len(more) else self.digit_run + leading
        else:
            self.digit_run = 0
        position = 0
        while position < len(more) and self.kind not in ("scalar", "trailing"):
            if self.kind == "closed":
                if more[position:].strip():
                    self.kind = "trailing"
                return
            if self.kind == "":
                stripped = len(more) - len(more[position:].lstrip())
                if stripped == len(more):
                    return
                char = more[stripped]
                if char in "{[":
                    self.kind, self.depth = "container", 1
                elif char == '"':
                    self.kind, self.in_string = "string", True
                else:
                    self.kind = "scalar"
                position = stripped + 1
                continue
            if self.escape:
                self.escape = False
                position += 1
                continue
            match = (STRING_STOP if self.in_string else STRUCTURE).search(more, position)
            if match is None:
                return
            char, position = match.group(), match.end()
            if self.in_string:
                if char == "\\":
                    self.escape = True
                else:
                    self.in_string = False
                    if self.kind == "string":
                        self.kind = "closed"
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
                self.deepest = max(self.deepest, self.depth)
            else:
                self.depth -= 1
                if self.depth == 0:
                    self.kind = "closed"

    def text(self) -> str:
        joined = "".join(self.parts)
        self.parts = [joined]
        return joined

    def loads(self) -> tuple[bool, object]:
        """(parsed, value) as json.loads would give; a syntax error is (False, None), other errors propagate."""
        digit_limit = sys.get_int_max_str_digits()
        risky = self.deepest >= DEEP_NESTING or 0 < digit_limit < self.longest_digits
        if self.kind in ("", "container", "string", "trailing") and not risky:
            return False, None
        if self.kind == "closed" and self.verdict is not None:
            return self.verdict
        try:
            verdict: tuple[bool, object] = (True, json.loads(self.text()))
        except json.JSONDecodeError:
            verdict = (False, None)
        if self.kind == "closed":
            self.verdict = verdict
        return verdict


def orjson_accepts(text: str) -> bool:
    """orjson.loads success (function_call/utils.py _is_complete_json): stricter than json.loads on NaN/Infinity,
    non-finite numbers and unpaired surrogates."""

    def reject(_: str) -> None:
        raise ValueError("constant")

    def check(value: object) -> bool:
        if isinstance(value, float):
            return value == value and value not in (float("inf"), float("-inf"))
        if isinstance(value, str):
            return not any("\ud800" <= c <= "\udfff" for c in value)
        if isinstance(value, list):
            return all(check(v) for v in value)
        if isinstance(value, dict):
            return all(check(k) and check(v) for k, v in value.items())
        return True

    try:
        return check(json.loads(text, parse_constant=reject))
    except (ValueError, RecursionError):
        return False


# ---------------------------------------------------------------- call headers and names
@dataclass
class Head:
    """`<|tool_call_begin|>\\s*(id)\\s*<|tool_call_argument_begin|>\\s*\\{` from one call-begin position, resumable."""

    start: int
    phase: int = 0
    position: int = 0
    id_start: int = 0
    id_end: int = 0
    literal: int = 0
    status: str = "pending"  # pending, failed, matched
    brace: int = -1

    def __post_init__(self) -> None:
        self.position = self.start + len(CALL_START)

    def advance(self, text: str, offset: int, final: bool) -> None:
        """Consume text[position - offset:] (the buffer from `offset`); deterministic, so no backtracking."""
        while self.status == "pending" and self.position - offset < len(text):
            char = text[self.position - offset]
            if self.phase == 0:  # \s* then the first id character
                if char.isspace():
                    self.position += 1
                    continue
                if not is_id_char(char):
                    self.status = "failed"
                    break
                self.phase, self.id_start = 1, self.position
            elif self.phase == 1:  # [^\s<|]+
                if is_id_char(char):
                    self.position += 1
                    continue
                self.id_end = self.position
                if char == "|":
                    self.status = "failed"
                    break
                self.phase = 2
            elif self.phase == 2:  # \s* then the argument marker
                if char.isspace():
                    self.position += 1
                    continue
                self.phase = 3
            elif self.phase == 3:
                if char != ARG_START[self.literal]:
                    self.status = "failed"
                    break
                self.literal += 1
                self.position += 1
                if self.literal == len(ARG_START):
                    self.phase = 4
            else:  # \s* then '{'
                if char.isspace():
                    self.position += 1
                    continue
                if char == "{":
                    self.status, self.brace = "matched", self.position
                else:
                    self.status = "failed"
                break
        if final and self.status == "pending":
            self.status = "failed"


def find_calls(text: str) -> list[tuple[str, str, int, int]]:
    """tool_call_regex.findall (kimik2_detector.py:71-74, 175) without its backtracking cost:
    (call id, arguments, start of the match, end of the match) per call."""
    calls = []
    position = 0
    while True:
        start = text.find(CALL_START, position)
        if start == -1:
            return calls
        head = Head(start)
        head.advance(text, 0, final=True)
        if head.status != "matched":
            position = start + 1
            continue
        close = args_close(text, head.brace)
        if close is None:  # no later call can close either
            return calls
        position = text.find(CALL_END, close) + len(CALL_END)
        calls.append((text[head.id_start : head.id_end], text[head.brace : close + 1], start, position))


def args_close(text: str, brace: int) -> int | None:
    """`\\{.*?\\}\\s*<|tool_call_end|>`: the first '}' after `brace` followed by whitespace and the end marker."""
    end = text.find(CALL_END, brace + 1)
    while end != -1:
        index = end - 1
        while index > brace and text[index].isspace():
            index -= 1
        if index > brace and text[index] == "}":
            return index
        end = text.find(CALL_END, end + 1)
    return None


def tool_function(tool: dict) -> dict:
    function = tool.get("function", tool)
    return function if isinstance(function, dict) else {}


class KimiReasoning:
    """BaseReasoningFormatDetector with Kimi's tokens (reasoning_parser.py:66-364, 516-557)."""

    def __init__(self, force_reasoning: bool, parser: SglangKimiK2Parser) -> None:
        self.parser = parser
        self.in_reasoning = force_reasoning
        self.buffer = ""
        self.stripped_think_start = False
        self.dropped_think = ""

    def parse_whole(self, text: str, log: EditLog) -> tuple[str, str]:
        """_detect_and_parse_impl (163-204)."""
        if not (self.in_reasoning or THINK_START in text):
            return "", text
        processed = text
        while processed.startswith(THINK_START):
            processed = processed[len(THINK_START) :]
        self.parser.record(log, "drop_leading_think", text, processed, "leading <think> tags removed")
        if THINK_END not in processed:
            tool = processed.find(SECTION_START)
            if tool != -1:  # the tool section interrupts reasoning (179-187)
                return processed[:tool], processed[tool:]
            return processed, ""
        reasoning, normal = processed.split(THINK_END, 1)
        return reasoning, normal

    def feed(self, new_text: str) -> tuple[str, str]:
        """_parse_streaming_increment_impl (224-303)."""
        if not self.buffer and "<" not in new_text:  # every marker starts with "<": nothing to hold or cut
            return (new_text, "") if self.in_reasoning else ("", new_text)
        self.buffer += new_text
        current = self.buffer
        if any(t.startswith(current) and t != current for t in (THINK_START, THINK_END, SECTION_START)):
            return "", ""
        if not self.stripped_think_start and THINK_START in current:
            current = current.replace(THINK_START, "", 1)
            self.dropped_think += THINK_START
            self.buffer = current
            self.stripped_think_start = True
            self.in_reasoning = True
        if self.in_reasoning and THINK_END in current:
            end = current.find(THINK_END)
            self.buffer = ""
            self.in_reasoning = False
            return current[:end], current[end + len(THINK_END) :]
        if self.in_reasoning:
            tool = current.find(SECTION_START)
            if tool != -1:
                self.buffer = ""
                self.in_reasoning = False
                return current[:tool], current[tool:]
            tokens = [THINK_END, SECTION_START] + ([] if self.stripped_think_start else [THINK_START])
            hold = max(partial_token_length(current, token) for token in tokens)
            self.buffer = current[len(current) - hold :]
            return current[: len(current) - hold], ""
        self.buffer = ""
        return "", current

    def finish(self) -> tuple[str, str]:
        """finish (336-364): the held-back tail is released."""
        if not self.in_reasoning:
            leftover, self.buffer = self.buffer, ""
            return "", leftover
        buffer = self.buffer.removeprefix(THINK_START)
        self.buffer = ""
        return buffer, ""


# ---------------------------------------------------------------- tools, non-streaming
def infer_tool_name(tools: list[dict], arguments: str | JsonPrefix | None) -> str | None:
    """_infer_tool_name (kimik2_detector.py:117-158): a bare counter id names its tool by the argument keys."""
    if not tools:
        return None
    if len(tools) == 1:
        return tool_function(tools[0]).get("name")
    if not arguments:
        return None
    try:
        if isinstance(arguments, JsonPrefix):
            parsed, value = arguments.loads()
        else:
            try:
                parsed, value = True, json.loads(arguments)
            except json.JSONDecodeError:
                parsed, value = False, None
    except (ValueError, RecursionError) as error:  # not among the (JSONDecodeError, TypeError) it catches
        raise DetectorFailure(str(error)) from error
    if not parsed:
        return None
    if not isinstance(value, dict):
        raise DetectorFailure(f"{type(value).__name__} has no keys()")
    keys = set(value)
    best_name, best_score = None, -1
    for tool in tools:
        parameters = tool_function(tool).get("parameters") or {}
        properties = set(schema_properties(parameters))  # through anyOf/oneOf/allOf (utils.py:307-323)
        if not properties:
            continue
        score = len(keys & properties) - len(keys - properties)
        if score > best_score:
            best_name, best_score = tool_function(tool).get("name"), score
    return best_name


class SglangKimiK2Parser(FamilyParser):
    """ReasoningParser("kimi_k2", force_reasoning) then FunctionCallParser(tools, "kimi_k2")."""

    # Set by the caller when known; the engine base class does not pass them to family parsers yet.
    chat_template_kwargs: dict | None = None
    history_tool_calls: int = 0
    lines = LINES

    def record(self, log: EditLog, step: str, before: str, after: str, description: str) -> None:
        path, line, end_line = self.lines[step]
        log.record(step, before, after, path, line, end_line, description)

    def force_reasoning(self) -> bool:
        """_get_reasoning_from_request (serving_chat.py:3518-3580): Kimi's default mode is "thinking"."""
        kwargs = self.chat_template_kwargs or {}
        return kwargs.get("thinking") is not False

    def call_id(self, name: str, index: int) -> str:
        """_process_tool_call_id (serving_chat.py:3129-3147)."""
        return f"functions.{name}:{self.history_tool_calls + index}"

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        tools_active = bool(tools) and bool(self.tool_parser)
        try:
            if stream:
                return self.parse_stream(chunks, tools, tools_active, log)
            return self.parse_whole(text, tools, tools_active, log)
        except RecursionError as error:
            return ParsedTurn(None, None, (), f"sglang fails the request: {error!r}")

    # ---- non-streaming (serving_chat.py:2930-3000, _process_tool_calls 3152-3215)
    def reasoning_detector(self) -> KimiReasoning:
        return KimiReasoning(self.force_reasoning(), self)

    def parse_whole(self, text: str, tools: list[dict], tools_active: bool, log: EditLog) -> ParsedTurn:
        reasoning = None
        if self.reasoning_parser:
            reasoning_text, text = self.reasoning_detector().parse_whole(text, log)
            reasoning = reasoning_text or None
        calls: list[ToolCall] = []
        if tools_active and SECTION_START in text:  # has_tool_call (kimik2_detector.py:160-162)
            text_with_calls = text
            normal, items = self.detect_and_parse(text, tools, log)
            text = self.after_parse(text, normal, items, log)
            calls = [ToolCall(self.call_id(name, index), name, arguments) for index, name, arguments in items]
            written_ids = [call_id for call_id, *_ in find_calls(text_with_calls)]
            if len(written_ids) == len(calls):
                for call, written in zip(calls, written_ids):
                    self.record(log, "call_id_rebuilt", written, call.id or "",
                                "the call id is rebuilt from the history's call count, not taken from the model's "
                                "header")
        # serving_chat.py:2991: content is never null
        return ParsedTurn(reasoning, text or "", tuple(calls))

    def after_parse(self, text: str, normal: str, items: list, log: EditLog) -> str:
        """FunctionCallParser.parse_non_stream (function_call_parser.py:215-221): the detector's text even when no
        call parsed (the marker was present), so an unfinished call is dropped (serving_chat.py:3180-3192)."""
        self.record(
            log,
            "content_before_section",
            text,
            normal,
            "content is the text before <|tool_calls_section_begin|>; the section and any text after it are dropped",
        )
        return normal

    def call_index(self, local_index: int, model_index: int) -> int:
        """0.5.23 numbers calls by position (kimik2_detector.py:180-203), ignoring the model's `:N`."""
        return local_index

    def detect_and_parse(self, text: str, tools: list[dict], log: EditLog) -> tuple[str, list]:
        """detect_and_parse (kimik2_detector.py:164-210); any error inside returns the whole text, no calls."""
        items: list = []
        edits: list[tuple] = []
        try:
            for call_id, arguments, start, match_end in find_calls(text):
                name, model_index = self.parse_call_id(call_id, tools, arguments)
                raw = text[text.find(ARG_START, start) + len(ARG_START) : text.rfind(CALL_END, 0, match_end)]
                if name is None:
                    edits.append(
                        ("drop_unrecognized_call", text[start:match_end], "", f"call id {call_id!r} names no tool")
                    )
                    continue
                edits.append(
                    (
                        "args_ws_trim",
                        raw,
                        arguments,
                        f"{name}: the call regex's \\s* drops whitespace around the JSON; the JSON text is kept as is",
                    )
                )
                items.append((self.call_index(len(items), model_index), name, arguments))
        except DetectorFailure:
            return text, []
        for edit in edits:
            self.record(log, *edit)
        return text[: text.find(SECTION_START)], items

    def parse_call_id(self, call_id: str, tools: list[dict], arguments: str | JsonPrefix | None) -> tuple:
        """_parse_tool_call_id (kimik2_detector.py:91-115)."""
        match = CALL_ID_RE.match(call_id)
        if match:
            return match.group("name"), int(match.group("index"))
        if COUNTER_RE.match(call_id):
            return infer_tool_name(tools, arguments), int(call_id)
        return None, 0

    # ---- streaming, as the oracle drives serving_chat.py's per-chunk calls
    def record_reasoning_stream(self, log: EditLog, reasoner: KimiReasoning) -> None:
        self.record(log, "drop_think_start", reasoner.dropped_think, "", "the first <think> in the stream is removed")

    def tool_stream(self, tools: list[dict]) -> KimiToolStream:
        return KimiToolStream(self, tools)

    def parse_stream(self, chunks: list[str], tools: list[dict], tools_active: bool, log: EditLog) -> ParsedTurn:
        reasoner = self.reasoning_detector() if self.reasoning_parser else None
        detector = self.tool_stream(tools) if tools_active else None
        reasoning_out: list[str] = []
        content_out: list[str] = []
        fed: list[str] = []
        calls: dict[int, dict] = {}
        chunks = keep_special_tokens_whole(chunks, SPECIAL_TOKENS)
        for position, chunk in enumerate(chunks):
            finished = position == len(chunks) - 1
            delta = chunk
            if reasoner is not None:
                reasoning_text, delta = reasoner.feed(delta)
                if finished:  # ReasoningParser.parse_stream_end
                    end_reasoning, end_normal = reasoner.finish()
                    reasoning_text += end_reasoning
                    delta += end_normal
                reasoning_out.append(reasoning_text)
            if detector is None:
                content_out.append(delta)
                continue
            fed.append(delta)
            normal, items = detector.feed(delta)
            content_out.append(normal)
            for index, name, arguments in items:
                entry = calls.setdefault(index, {"id": None, "name": "", "arguments": []})
                if name and entry["id"] is None:
                    entry["id"] = self.call_id(name, index)
                entry["name"] += name or ""
                entry["arguments"].append(arguments)
            if finished:
                remaining = detector.unstreamed_arguments()  # serving_chat.py:3758-3830
                if remaining is not None:
                    entry = calls.setdefault(remaining[0], {"id": None, "name": "", "arguments": []})
                    entry["arguments"].append(remaining[1])
                    self.record(
                        log,
                        "args_unstreamed_tail",
                        "",
                        remaining[1],
                        "the end of the stream appends what json.dumps(prev_tool_call_arr) has beyond the streamed "
                        "arguments",
                    )
        content = "".join(content_out)
        if reasoner is not None:
            self.record_reasoning_stream(log, reasoner)
        if detector is not None:
            detector.record(log, "".join(fed), content)
        result = [
            ToolCall(entry["id"], entry["name"], "".join(entry["arguments"])) for _, entry in sorted(calls.items())
        ]
        return ParsedTurn("".join(reasoning_out) or None, content or None, tuple(result))


# ---------------------------------------------------------------- tools, streaming
class KimiToolStream:
    """KimiK2Detector.parse_streaming_increment (kimik2_detector.py:212-360) with FunctionCallParser's wrapper."""

    def __init__(self, parser: SglangKimiK2Parser, tools: list[dict]) -> None:
        self.parser = parser
        self.tools = tools
        self.buffer = Growing()
        self.current_tool_id = -1
        self.prev_tool_call_arr: list[dict] = []
        self.streamed_args: list[list[str]] = []
        self.name: str | None = None
        self.last_length = 0
        self.inference: JsonPrefix | None = None
        self.inference_fed = 0
        self.stripped: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, str, int, int, str]] = []

    def emit(self, text: str) -> str:
        cleaned = strip_tool_tokens(text)
        if cleaned != text:
            self.stripped.append((text, cleaned))
        return cleaned

    def drop(self, step: str, text: str, description: str) -> None:
        if text:
            self.dropped.append((step, text, description))

    def reset_in_flight(self) -> None:
        self.last_length = 0
        self.name = None
        self.inference = None
        self.inference_fed = 0

    def feed(self, new_text: str) -> tuple[str, list]:
        self.buffer.append(new_text)
        if self.name is None and self.buffer.find(SECTION_START) == -1 and self.buffer.find(CALL_START) == -1:
            emit, hold = split_pending_start(self.buffer.text())
            self.buffer = Growing(hold)
            return self.emit(emit), []
        normal: list[str] = []
        calls: list = []
        try:
            self.drain(normal, calls)
        except DetectorFailure:
            # "Drop the buffer to avoid leaking raw special tokens" (353-360)
            self.drop("drop_buffer_on_error", self.buffer.text(), "the detector failed; its buffer is lost")
            self.buffer = Growing()
            self.reset_in_flight()
        return "".join(normal), calls

    def drain(self, normal: list[str], calls: list) -> None:
        while True:
            buffer = self.buffer
            begin = buffer.find(CALL_START)
            if begin == -1:
                emit, hold = split_pending_start(buffer.text())
                if emit:
                    normal.append(self.emit(emit))
                self.buffer = Growing(hold)
                return
            if begin > 0:
                normal.append(self.emit(buffer.slice(0, begin)))
                self.buffer = buffer = Growing(buffer.slice(begin))
            arg_begin = buffer.find(ARG_START)
            next_begin = buffer.find(CALL_START, len(CALL_START))
            if next_begin != -1 and (arg_begin == -1 or next_begin < arg_begin):
                self.drop(
                    "drop_malformed_call",
                    buffer.slice(0, next_begin),
                    "a call begin without its argument marker before the next call begin is discarded",
                )
                self.buffer = Growing(buffer.slice(next_begin))
                self.reset_in_flight()
                continue
            if arg_begin == -1:
                return
            args_start = arg_begin + len(ARG_START)
            end = buffer.find(CALL_END)
            just_resolved = False
            if self.name is None:
                call_id = buffer.slice(len(CALL_START), arg_begin).strip()
                resolved = self.resolve(call_id, buffer, args_start, end)
                if resolved is None:
                    if end == -1:
                        return
                    self.drop(
                        "drop_unrecognized_call_stream",
                        buffer.slice(0, end + len(CALL_END)),
                        f"call id {call_id!r} names no tool: the call is skipped",
                    )
                    self.buffer = Growing(buffer.slice(end + len(CALL_END)))
                    self.reset_in_flight()
                    continue
                self.name = resolved
                just_resolved = True
                if self.current_tool_id == -1:
                    self.current_tool_id = 0
                    self.prev_tool_call_arr = []
                    self.streamed_args = [[]]
                while len(self.prev_tool_call_arr) <= self.current_tool_id:
                    self.prev_tool_call_arr.append({})
                while len(self.streamed_args) <= self.current_tool_id:
                    self.streamed_args.append([])
                self.prev_tool_call_arr[self.current_tool_id] = {"name": resolved, "arguments": {}}
            diff = buffer.slice(args_start + self.last_length, end if end != -1 else buffer.length)
            if diff or just_resolved:
                calls.append((self.current_tool_id, self.name if just_resolved else None, diff))
                if diff:
                    self.last_length += len(diff)
                    self.streamed_args[self.current_tool_id].append(diff)
            if end == -1:
                return
            self.buffer = Growing(buffer.slice(end + len(CALL_END)))
            self.current_tool_id += 1
            self.reset_in_flight()

    def resolve(self, call_id: str, buffer: Growing, args_start: int, end: int) -> str | None:
        """_resolve_function_name (kimik2_detector.py:401-415); arguments only matter for a bare counter."""
        if call_id:
            match = CALL_ID_RE.match(call_id)
            if match:
                return match.group("name")
            if not COUNTER_RE.match(call_id):
                return None
        if len(self.tools) < 2:
            return infer_tool_name(self.tools, None)
        stop = end if end != -1 else buffer.length
        if self.inference is None:
            self.inference = JsonPrefix()
        if stop > args_start + self.inference_fed:
            self.inference.extend(buffer.slice(args_start + self.inference_fed, stop))
            self.inference_fed = stop - args_start
        if self.inference_fed == 0:
            return None
        return infer_tool_name(self.tools, self.inference)

    def unstreamed_arguments(self) -> tuple[int, str] | None:
        """_check_for_unstreamed_tool_args (serving_chat.py:3758-3830)."""
        if not self.prev_tool_call_arr or not self.streamed_args:
            return None
        index = len(self.prev_tool_call_arr) - 1
        if index < 0 or index >= len(self.streamed_args):
            return None
        expected = self.prev_tool_call_arr[index].get("arguments", {})
        expected = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        actual = "".join(self.streamed_args[index])
        remaining = expected[len(actual) :] if expected.startswith(actual) else ""
        return (index, remaining) if remaining else None

    def record(self, log: EditLog, fed: str, content: str) -> None:
        parser = self.parser
        parser.record(
            log,
            "strip_tool_tokens",
            "".join(before for before, _ in self.stripped),
            "".join(after for _, after in self.stripped),
            "tool-call special tokens are removed from streamed text",
        )
        for step, text, description in self.dropped:
            parser.record(log, step, text, "", description)
        parser.record(
            log,
            "drop_unflushed_buffer",
            self.buffer.text(),
            "",
            "text the detector still holds when the stream ends is never released",
        )
        parser.record(
            log,
            "tool_detector_stream",
            fed,
            content,
            "streamed content: tool-call markup and arguments are taken out, text around them is kept",
        )
