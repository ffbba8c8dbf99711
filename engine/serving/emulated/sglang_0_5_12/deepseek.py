"""SGLang 0.5.12 DeepSeek DSML: the same serving glue as 0.5.23, with the older pieces it ran.

- `deepseek-v4` (and `deepseek-v3`) reasoning is _DeepSeekV3Detector = Qwen3Detector
  (parser/reasoning_parser.py:574-579, 224-263): the whole output is `.replace("<think>", "").strip()`-ed and the
  answer `.strip()`-ed (73-75, 102); streaming rstrips the reasoning of the chunk that holds </think> (153) and has
  no parse_stream_end.
- DeepSeekV32Detector (function_call/deepseekv32_detector.py) streamed a call's name first and then argument diffs
  computed from partial parses (partial_json_parser for string="false" values), had no finish(), and its
  non-streaming parse kept the whole text when no call survived (function_call_parser.py:124-131).
"""

from __future__ import annotations

import json
import re
from json.decoder import WHITESPACE

from engine.serving.emulated.sglang_0_5_12.reasoning import ReasoningDetector0512
from engine.serving.emulated.sglang_0_5_23.deepseek import (
    DSML,
    DsmlDetector,
    Item,
    SglangDeepSeekParser,
)

REASONING = "sglang/srt/parser/reasoning_parser.py"
DETECTOR = "sglang/srt/function_call/deepseekv32_detector.py"
UTILS = "sglang/srt/function_call/utils.py"


# ---------------------------------------------------------------- partial JSON (partial_json_parser 0.2.1)
class PartialJsonError(Exception):
    """partial_json_parser's MalformedJSON / PartialJSON: NOT json.JSONDecodeError, so the detector's
    `except json.JSONDecodeError` (deepseekv32_detector.py:205) does not catch it and the whole chunk fails."""


class _StackUnderflow(IndexError):
    """fix_fast's stack.pop() on an unmatched closer: 'pop from empty list', caught by utils.py:43-48."""


def partial_json_loads(text: str) -> object:
    """utils.py:23-49 _partial_json_loads(text, Allow.ALL): complete a cut-off JSON value and decode it."""
    try:
        return json.loads(_ensure_json(text))
    except json.JSONDecodeError as exc:
        if "Extra data" not in exc.msg:
            raise
    except _StackUnderflow:
        pass
    return json.JSONDecoder().raw_decode(text, WHITESPACE.match(text, 0).end())[0]


def _escaped(text: str, index: int) -> bool:
    before = text[:index]
    return (index - len(before.rstrip("\\"))) % 2 == 1


def _closers(stack: list[tuple[int, str]]) -> str:
    return "".join("}" if char == "{" else "]" for _, char in reversed(stack))


def _ensure_json(text: str) -> str:
    """partial_json_parser core/myelin.py fix_fast (Allow.ALL): the completed JSON text. A bracket-balanced text is
    returned as is; an unmatched closer underflows the stack; an open container is closed after trimming the
    trailing partial member, each branch as the library takes it."""
    brackets = [(m.start(), m.group()) for m in re.finditer(r'["\[\]{}]', text)]
    if not brackets or brackets[0][1] == '"':
        return "".join(_fix(text, top_level=True))
    stack: list[tuple[int, str]] = []
    in_string, string_start, string_end = False, -1, -1
    for index, char in brackets:
        if char == '"':
            if not in_string:
                in_string, string_start = True, index
            elif not _escaped(text, index):
                in_string, string_end = False, index
        elif not in_string:
            if char in "}]":
                if not stack:
                    raise _StackUnderflow("pop from empty list")
                if stack.pop()[1] != ("{" if char == "}" else "["):
                    raise PartialJsonError(f"mismatched {char}")
            else:
                stack.append((index, char))
    if not stack:
        return text
    head, tail = _complete_open(text, stack, in_string, string_start, string_end, index, char)
    return head + tail


def _complete_open(
    text: str, stack: list[tuple[int, str]], in_string: bool, string_start: int, string_end: int, last: int, char: str
) -> tuple[str, str]:
    """The rest of fix_fast: `last`/`char` are the position and character of the last bracket or quote."""
    top_index, top = stack[-1]
    if in_string:
        if top == "[":  # [ ... "val
            head, tail = _fix(text[string_start:])
            return text[:string_start] + head, tail + _closers(stack)
        start = max(string_end, top_index)
        if "," in text[start + 1 : string_start]:  # { ... "k": 1, "key
            comma = text.rindex(",", start, string_start)
            head, tail = _fix("{" + text[comma + 1 :])
            return text[:comma] + head[1:], tail + _closers(stack[:-1])
        if ":" in text[start + 1 : string_start]:  # { ... ": "val
            head, tail = _fix(text[string_start:])
            return text[:string_start] + head, tail + _closers(stack)
        return text[:string_start], _closers(stack)  # {"key
    comma = text.rfind(",", max(string_end, last) + 1)
    if comma != -1:
        if not text[comma + 1 :].strip():  # { ... "key": "value",
            return text[:comma], _closers(stack)
        if top != "[":
            raise PartialJsonError("non-string literals after a comma in an object")
        head, tail = _fix("[" + text[comma + 1 :])
        if not head[1:] + tail[:-1].strip():
            return text[:comma] + head[1:], tail + _closers(stack[:-1])
        return text[: comma + 1] + head[1:], tail + _closers(stack[:-1])
    if char in "]}":
        if text[last + 1 :].strip():
            raise PartialJsonError("text after a closed container")
        return text, _closers(stack)
    if char in "[{":
        head, tail = _fix(text[last:])
        return text[:last] + head, tail + _closers(stack[:-1])
    if top == "[":  # [ ... "val"
        return text, _closers(stack)
    colon = text.rfind(":", string_end)
    comma = text.rfind(",", top_index + 1, string_start)
    if comma == -1:  # { "key" / { "key": "value"
        head, tail = _fix(text[top_index:])
        return text[:top_index] + head, tail + _closers(stack[:-1])
    if colon == -1:
        if text.rfind(":", max(top_index, comma) + 1, string_start) != -1:  # { ... , "key": "value"
            return text, _closers(stack)
        head, tail = _fix("{" + text[comma + 1 :])  # { ... , "key"
        if not head[1:] + tail[:-1].strip():
            return text[:comma] + head[1:], tail + _closers(stack[:-1])
        return text[: comma + 1] + head[1:], tail + _closers(stack)
    if colon <= comma:
        raise PartialJsonError("colon before the last comma")
    head, tail = _fix("{" + text[comma + 1 :])  # { ... , "key":
    if not head[1:] + tail[:-1].strip():
        return text[:comma] + head[1:], tail + _closers(stack[:-1])
    return text[: comma + 1] + head[1:], tail + _closers(stack[:-1])


def _fix(text: str, top_level: bool = False) -> tuple[str, str]:
    """core/complete.py _fix: (the complete slice of `text`, the suffix that closes it)."""
    try:
        result = _complete_any(text.strip(), top_level)
    except (AssertionError, IndexError) as exc:
        raise PartialJsonError(str(exc)) from exc
    if result is False:
        raise PartialJsonError("partial")
    index, completion = result
    return text[:index], ("" if completion is True else str(completion))


Completion = tuple[int, "str | bool"] | bool


def _skip_blank(text: str, index: int) -> int:
    try:
        while text[index].isspace():
            index += 1
    except IndexError:
        pass
    return index


def _complete_any(text: str, top_level: bool = False) -> Completion:
    char = text[_skip_blank(text, 0)]
    if char == '"':
        return _complete_string(text)
    if char in "1234567890":
        return _complete_number(text, top_level)
    if char == "[":
        return _complete_container(text, "]")
    if char == "{":
        return _complete_container(text, "}")
    for literal in ("null", "true", "false", "Infinity"):
        if text.startswith(literal):
            return len(literal), True
        if literal.startswith(text):
            return 0, literal
    if char == "-":
        if len(text) == 1:
            return False
        if text[1] != "I":
            return _complete_number(text, top_level)
    for literal in ("-Infinity", "NaN"):
        if text.startswith(literal):
            return len(literal), True
        if literal.startswith(text):
            return 0, literal
    raise PartialJsonError(f"Unexpected character {char}")


def _complete_string(text: str) -> Completion:
    assert text[0] == '"'
    index = 1
    try:
        while True:
            char = text[index]
            if char == "\\":
                if index + 1 == len(text):
                    raise IndexError
                index += 2
                continue
            if char == '"':
                return index + 1, True
            index += 1
    except IndexError:
        for escape, width in (("\\u", 5), ("\\U", 9), ("\\x", 3)):
            found = text.rfind(escape, max(0, index - width), index)
            if found != -1 and not _escaped(text, found):
                return found, '"'
        return index, '"'


def _complete_number(text: str, top_level: bool) -> Completion:
    index = 1
    while index < len(text) and text[index] in "1234567890.-+eE":
        index += 1
    modified = False
    while text[index - 1] in ".-+eE":
        modified = True
        index -= 1
    if modified or (index == len(text) and not top_level):
        return index, ""
    return index, True


def _complete_container(text: str, closer: str) -> Completion:
    """core/complete.py complete_arr / complete_obj."""
    kept = position = 1
    try:
        while True:
            position = _skip_blank(text, position)
            if text[position] == closer:
                return position + 1, True
            if closer == "}":
                key = _complete_string(text[position:])
                if not (key and key[1] is True):
                    return kept, "}"
                position = _skip_blank(text, position + key[0])
                if text[position] != ":":
                    raise PartialJsonError(f"Expected ':', got {text[position]}")
                position = _skip_blank(text, position + 1)
            value = _complete_any(text[position:])
            if value is False:
                return kept, closer
            if value[1] is not True:
                return position + value[0], str(value[1]) + closer
            kept = position = position + value[0]
            position = _skip_blank(text, position)
            if text[position] == ",":
                position += 1
            elif text[position] == closer:
                return position + 1, True
            else:
                raise PartialJsonError(f"Expected ',' or '{closer}', got {text[position]}")
    except IndexError:
        return kept, closer


def _common_prefix(first: str, second: str) -> str:
    """utils.py:12-20 _find_common_prefix, by bisection on slices (the same prefix, without a per-character loop)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[low:middle] == second[low:middle]:
            low = middle
        else:
            high = middle - 1
    return first[:low]


# ---------------------------------------------------------------- the 0.5.12 detector
class DsmlDetector0512(DsmlDetector):
    """deepseekv32_detector.py at 0.5.12 (V4: deepseekv4_detector.py:60-64 sets the tool_calls block)."""

    current_tool_name_sent: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        parameter = f"{DSML}parameter"
        self.partial_parameter_re = re.compile(rf'<{parameter}\s+name="([^"]+)"\s+string="([^"]+)"\s*>(.*)$', re.DOTALL)

    def has_tool_call(self, text: str) -> bool:
        return self.bot in text or f"<{DSML}invoke" in text

    def parameters_partial(self, body: str, name: str, allow_partial: bool) -> str:
        """deepseekv32_detector.py:137-208: as 0.5.23 without the malformed checks, plus the partial last value."""
        stripped = body.strip()
        if stripped.startswith("{"):
            if allow_partial:
                for token in ("oke", "inv", DSML, "</"):
                    stripped = stripped.rstrip(token)  # rstrip of characters, as the code does
                return stripped
            if stripped.endswith("}"):
                return stripped
        values: dict[str, object] = {}
        last_end = 0
        for match in self.parameter_matches(body):
            key, kind, raw = match.key, match.kind, match.raw
            last_end = match.end
            if kind == "true":
                values[key] = raw.strip()
                self.note("param_value_strip", raw, raw.strip(), 173, 174, f"{name}.{key}: string value .strip()")
            else:
                try:
                    values[key] = json.loads(raw.strip())
                except ValueError:
                    values[key] = raw.strip()
        if allow_partial:
            remaining = body[last_end:]
            for token in ("parameter", DSML, "</"):
                remaining = remaining.rstrip(token)
            partial = self.partial_parameter_re.search(remaining)
            if partial and partial.group(3):
                value = partial.group(3)
                if partial.group(2) == "true":
                    values[partial.group(1)] = value.strip()
                else:
                    try:
                        values[partial.group(1)] = partial_json_loads(value)
                    except json.JSONDecodeError:
                        values[partial.group(1)] = value.strip()
        return json.dumps(values, ensure_ascii=False)

    def detect_and_parse(self, text: str, tools: list[dict]) -> tuple[str, list[tuple[str, str]]]:
        """deepseekv32_detector.py:210-250: the first block only; an unclosed invoke inside it is parsed anyway."""
        start = text.find(self.bot)
        if start == -1:
            return text, []
        normal = text[:start].strip()
        try:
            sections = self.blocks(text)[:1]  # re.search: the first block
            if not sections:
                return normal, []
            calls: list[tuple[str, str]] = []
            for match in self.invokes(sections[0]):
                name, body = match.name, match.body
                arguments = self.parameters_partial(body, name, False)
                calls.extend(self.base_json(name, json.loads(arguments), tools, arguments))
            return normal, calls
        except Exception:  # 247-250: the whole text is returned
            return text, []

    def stream(self, new_text: str) -> tuple[str, list[Item]]:
        """deepseekv32_detector.py:252-385: the name first, then diffs of the stable prefix of the arguments."""
        self.buffer += new_text
        current = self.buffer
        dsml_like = any(marker in current for marker in (DSML, "<｜", "</｜"))
        tail = current.rstrip()
        prefix_tail = any(tail.endswith(p) for p in ("<", "<｜", "</", "</｜"))
        if not self.has_tool_call(current) and not dsml_like and not prefix_tail:
            self.buffer = ""
            for token in (self.eot, self.invoke_end):
                current = current.replace(token, "")
            return current, []
        items: list[Item] = []
        try:
            while True:
                match = self.find_invoke(current)
                if match is None:
                    break
                name, body, complete = match.name, match.body, match.complete
                if self.current_tool_id == -1:
                    self.current_tool_id = 0
                    self.prev_tool_call_arr, self.streamed_args_for_tool = [], [""]
                while len(self.prev_tool_call_arr) <= self.current_tool_id:
                    self.prev_tool_call_arr.append({})
                while len(self.streamed_args_for_tool) <= self.current_tool_id:
                    self.streamed_args_for_tool.append("")
                if not self.current_tool_name_sent:
                    items.append(Item(self.current_tool_id, name, ""))
                    self.current_tool_name_sent = True
                arguments = self.parameters_partial(body, name, not complete)
                sent = len(self.streamed_args_for_tool[self.current_tool_id])
                previous = self.prev_tool_call_arr[self.current_tool_id].get("arguments")
                diff = None
                if complete:
                    diff = arguments[sent:]
                elif previous is not None and arguments != previous:
                    prefix = _common_prefix(arguments, previous)
                    if len(prefix) > sent:
                        diff = prefix[sent:]
                if complete:
                    self.note("args_dsml_to_json", body, arguments, 324, 339, f"{name}: arguments as streamed")
                if diff:
                    items.append(Item(self.current_tool_id, None, diff))
                    self.streamed_args_for_tool[self.current_tool_id] += diff
                self.prev_tool_call_arr[self.current_tool_id] = {"name": name, "arguments": arguments}
                if not complete:
                    break
                self.buffer = current = current[match.end :]
                self.current_tool_id += 1
                self.current_tool_name_sent = False
            return "", items
        except Exception:  # 383-385: the buffer is returned as text (and kept)
            return current, []

    def finish(self) -> str:
        return ""


class SglangDeepSeekParser0512(SglangDeepSeekParser):
    version = "0.5.12"
    has_stream_end = False
    detector_class = DsmlDetector0512
    think_detector_class = ReasoningDetector0512
    content_lines = (218, 221)
    content_note = "content is the text before the DSML block, .strip()-ed; the rest is dropped"
    stream_lines = (252, 385)

    def _tool_start(self) -> str | None:
        return None  # 0.5.12's Qwen3Detector had no tool_start_token

    def non_stream_tools(self, detector: DsmlDetector, text: str, tools: list[dict]) -> tuple[str, list]:
        """function_call_parser.py:112-131: with no call the whole text is kept, markup included."""
        normal, calls = detector.detect_and_parse(text, tools)
        return (normal, calls) if calls else (text, [])

    unstreamed_lines = (1690, 1699)

    @staticmethod
    def unstreamed_remainder(expected: object, actual: str) -> str:
        """0.5.12's serving_chat.py:1690-1699 JSON-dumps the arguments even when the detector stored them as a
        string (DSML does), and removes what was streamed wherever it occurs in that: a finished call without
        arguments gets '""' after its '{}', a truncated one nothing (its streamed prefix is not in the escaped dump)."""
        expected_call = json.dumps(expected, ensure_ascii=False)
        return expected_call.replace(actual, "", 1) if actual in expected_call else ""

