"""SGLang 0.5.23 GLM-4.5 … 5.1: `--reasoning-parser glm45` with `--tool-call-parser glm45` (Glm4MoeDetector, GLM-4.5/4.6
format: a newline after the name) or `glm47` (Glm47MoeDetector, GLM-4.7/5.x format: `<arg_key>` right after the name).

serving_chat.py chains the reasoning parser (Glm45Detector, reasoning_parser.py:911-952, force_reasoning because the
template opens `<think>`) and the tool detector: non-streaming on the whole text (2930-2968, 3150-3200), streaming
delta by delta with a final flush and the unstreamed-arguments check (919-1031, 3301-3332, 3604-3833). Every special
token is one streaming delta, as the detokenizer emits it.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import schema_properties, special_token_deltas
from engine.serving.emulated.sglang_0_5_23.reasoning import ReasoningDetector
from engine.types import ToolCall

REASONING = "sglang/srt/parser/reasoning_parser.py"
GLM4 = "sglang/srt/function_call/glm4_moe_detector.py"
GLM47 = "sglang/srt/function_call/glm47_moe_detector.py"
BASE = "sglang/srt/function_call/base_format_detector.py"
SERVING = "sglang/srt/entrypoints/openai/serving_chat.py"
RANDOM_ID = "call_<uuid>"

THINK_START, THINK_END = "<think>", "</think>"
BOT, EOT = "<tool_call>", "</tool_call>"
ARG_VALUE_END = "</arg_value>"
# the tag each argument state waits for (its buffer is emptied on every transition)
TAG_AWAITED = {"init": "<arg_key>", "between": "<arg_key>", "key": "</arg_key>", "waiting": "<arg_value>"}
# one streaming delta per special token (the GLM-4.7/5.x tokenizer's grammar and special added tokens)
SPECIAL_TOKENS = (
    THINK_START,
    THINK_END,
    BOT,
    EOT,
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
)
SPECIAL_RE = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))
ARG_PAIR_RE = re.compile(r"<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>", re.DOTALL)
END_RE = re.compile(r"</tool_call>|$")


def call_spans(text: str) -> list[tuple[int, int]]:
    """Where re.finditer(r"<tool_call>.*?</tool_call>", DOTALL) matches (glm4 242, glm47 373/387), found in linear
    time: without a closing tag after the first opening one no later opening tag can match either, whereas the regex
    retries from every one of them."""
    spans: list[tuple[int, int]] = []
    position = 0
    while True:
        start = text.find(BOT, position)
        end = text.find(EOT, start + len(BOT)) if start != -1 else -1
        if end == -1:
            return spans
        position = end + len(EOT)
        spans.append((start, position))


class Text:
    """A string built by appending, joined only when read: streams append to it on every delta."""

    def __init__(self, first: str = "") -> None:
        self.parts = [first] if first else []

    def append(self, text: str) -> None:
        if text:
            self.parts.append(text)

    @property
    def value(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""


def functions(tools: list[dict]) -> list[tuple[str, Any]]:
    """(name, parameters) of each declared tool, in request order."""
    out = []
    for tool in tools:
        function = tool.get("function", tool)
        out.append((function.get("name"), function.get("parameters")))
    return out


def literal_eval(value: str) -> Any:
    """safe_literal_eval (function_call/utils.py:236-256): ast.literal_eval with its escape warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.literal_eval(value)


# ---------------------------------------------------------------- schema type inference (function_call/utils.py)
def infer_type(schema: Any) -> str | None:
    """infer_type_from_json_schema (utils.py:326-429); [T, null] unions resolve to T (374-376)."""
    if not isinstance(schema, dict):
        return None
    if "type" in schema:
        declared = schema["type"]
        if isinstance(declared, str):
            return declared
        if isinstance(declared, list) and declared:
            non_null = [t for t in declared if t != "null"]
            return non_null[0] if non_null else "string"
    if "anyOf" in schema or "oneOf" in schema:
        branches = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(branches, list):
            types = [t for t in (infer_type(b) for b in branches) if t]
            if types:
                if len(set(types)) == 1:
                    return types[0]
                if len(set(types)) == 2 and "null" in types:
                    return [t for t in types if t != "null"][0]
                return "string" if "string" in types else types[0]
    if "enum" in schema and isinstance(schema["enum"], list):
        if not schema["enum"]:
            return "string"
        kinds = {kind for kind in (enum_kind(value) for value in schema["enum"]) if kind}
        return kinds.pop() if len(kinds) == 1 else "string"
    if "allOf" in schema and isinstance(schema["allOf"], list):
        for branch in schema["allOf"]:
            inferred = infer_type(branch)
            if inferred and inferred != "string":
                return inferred
        return "string"
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def enum_kind(value: Any) -> str | None:
    """The JSON type an enum value implies (utils.py:388-404); None for a value of no JSON type."""
    for python_type, kind in ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number")):
        if isinstance(value, python_type):
            return kind
    for python_type, kind in ((str, "string"), (list, "array"), (dict, "object")):
        if isinstance(value, python_type):
            return kind
    return None


JSON_KINDS = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}


def json_kind(value: Any) -> str:
    """_json_type (glm47_moe_detector.py:52-63): an integral float is "integer"; a value of no JSON type (a tuple
    from literal_eval) raises KeyError, as the real lookup does."""
    if isinstance(value, float) and value.is_integer():
        return "integer"
    return {**JSON_KINDS, dict: "object"}[type(value)]


def to_number(value: str) -> Any:
    """_convert_to_number: float when the text has "." or "e", else int; the text itself when neither parses."""
    try:
        return float(value) if "." in value or "e" in value.lower() else int(value)
    except (ValueError, AttributeError):
        return value


# ---------------------------------------------------------------- GLM-4.7 schema logic (glm47_moe_detector.py:52-210)
_UNSET = object()


def json_equal(left: Any, right: Any) -> bool:
    if json_kind(left) != json_kind(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(json_equal(v, right[k]) for k, v in left.items())
    if isinstance(left, list):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right))
    return left == right


def matches_discriminators(schema: Any, root: Any, arguments: dict) -> bool:
    for name, value in arguments.items():
        types = argument_types(schema, root, name, value=value)
        if types is not None and json_kind(value) not in types:
            return False
    return True


def argument_types(
    schema: Any,
    root: Any,
    key: str | None = None,
    seen: frozenset[int] = frozenset(),
    arguments: dict | None = None,
    value: Any = _UNSET,
) -> set[str] | None:
    """glm47_moe_detector.py:88-149: every type a key (or schema) allows, narrowed by `value` and sibling values."""
    if not isinstance(schema, dict) or id(schema) in seen:
        return None
    seen = seen | {id(schema)}
    constraints: list[set[str]] = []
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        target = root
        try:
            for part in ref[2:].split("/") if ref != "#" else []:
                part = part.replace("~1", "/").replace("~0", "~")
                target = target[int(part)] if isinstance(target, list) else target[part]
            types = argument_types(target, root, key, seen, arguments, value)
            if types is not None:
                constraints.append(types)
        except (KeyError, IndexError, TypeError, ValueError):
            pass
    if key is not None:
        types = argument_types(schema.get("properties", {}).get(key), root, seen=seen, value=value)
        if types is not None:
            constraints.append(types)
    else:
        declared = schema.get("type")
        if isinstance(declared, str):
            constraints.append({declared, "integer"} if declared == "number" else {declared})
        elif isinstance(declared, list):
            constraints.append(set(declared) | ({"integer"} if "number" in declared else set()))
        values = [schema["const"]] if "const" in schema else schema.get("enum")
        if isinstance(values, list):
            constraints.append(
                {json_kind(allowed) for allowed in values if value is _UNSET or json_equal(value, allowed)}
            )
    for keyword in ("anyOf", "oneOf"):
        if isinstance(schema.get(keyword), list):
            alternatives = [
                argument_types(branch, root, key, seen, arguments, value)
                for branch in schema[keyword]
                if key is None or matches_discriminators(branch, root, arguments or {})
            ]
            if alternatives and all(types is not None for types in alternatives):
                constraints.append(set().union(*alternatives))
    if isinstance(schema.get("allOf"), list):
        for branch in schema["allOf"]:
            types = argument_types(branch, root, key, seen, arguments, value)
            if types is not None:
                constraints.append(types)
    return set.intersection(*constraints) if constraints else None


def tool_argument_types(
    name: str, key: str, tools: list[dict], arguments: dict | None = None, value: Any = _UNSET
) -> set[str] | None:
    for tool_name, parameters in functions(tools):
        if tool_name == name:
            return argument_types(parameters, parameters, key, arguments=arguments, value=value)
    return None


def needs_argument_context(schema: Any) -> bool:
    """glm47_moe_detector.py:176-210: a root union whose keys' types depend on the branch."""
    keys: set = set()
    seen: set[int] = set()
    has_union = False

    def visit(node: Any) -> None:
        nonlocal has_union
        if not isinstance(node, dict) or id(node) in seen:
            return
        seen.add(id(node))
        keys.update(node.get("properties", {}))
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            target = schema
            try:
                for part in ref[2:].split("/") if ref != "#" else []:
                    part = part.replace("~1", "/").replace("~0", "~")
                    target = target[int(part)] if isinstance(target, list) else target[part]
                visit(target)
            except (KeyError, IndexError, TypeError, ValueError):
                pass
        for keyword in ("anyOf", "oneOf", "allOf"):
            branches = node.get(keyword)
            if isinstance(branches, list):
                has_union |= keyword != "allOf"
                for branch in branches:
                    visit(branch)

    visit(schema)
    for key in keys if has_union else ():
        types = argument_types(schema, schema, key)
        if types is None or len(types) > 1 and types != {"number", "integer"}:
            return True
    return False


# ---------------------------------------------------------------- tool detectors
@dataclass
class CallItem:
    """ToolCallItem: a streamed name (first delta of a call) or an arguments fragment."""

    index: int
    name: str | None
    parameters: str


@dataclass
class StreamResult:
    normal: str = ""
    calls: list[CallItem] = field(default_factory=list)


class GlmDetectorBase:
    """What both GLM detectors share: BaseFormatDetector state (base_format_detector.py:35-57) and the
    per-argument streaming state machine."""

    path = GLM4
    lines: dict[str, tuple[int, int]] = {}

    def __init__(self, tools: list[dict], log: EditLog) -> None:
        self.tools = tools
        self.log = log
        self.buffer = ""
        self.prev_tool_call_arr: list[dict] = []
        self.current_tool_id = -1
        self.current_tool_name_sent = False
        self.streamed_args_for_tool: list[Text] = []
        self.last_arguments = Text()
        self.streamed_raw_length = 0
        self.open_call: tuple[str, int] | None = None
        self.end_scan_pos = 0
        # the fast path (see parse_delta): text not yet joined into the buffer, its length, its last characters
        self.mode: str | None = None
        self.pending: list[str] = []
        self.total = 0
        self.tail = ""
        self.args_left: int | None = None
        self.args_right = 0
        self.spaces_from = 0
        self.spaces = ""
        self.reset_streaming_state()

    def reset_streaming_state(self) -> None:
        self.stream_state = "init"
        self.current_key = ""
        self.current_value = Text()
        self.xml_tag_buffer = ""  # the value state's buffer: a possible </arg_value> prefix
        self.held = Text()  # the other states' buffer
        self.held_tail = ""
        self.is_first_param = True
        self.value_started = False
        self.cached_value_type: str | None = None

    # -- shared pieces
    def tool_names(self) -> dict[str, int]:
        return {name: i for i, (name, _) in enumerate(functions(self.tools)) if name}

    def declared_call(self, name: str, arguments: dict) -> CallItem | None:
        """parse_base_json (base_format_detector.py:77-101): calls to undeclared tools are skipped."""
        names = self.tool_names()
        if not (name and name in names):
            self.log.record(
                "drop_undeclared_call",
                name,
                "",
                BASE,
                84,
                88,
                f"{name!r} is not a declared tool: the call is dropped (SGLANG_FORWARD_UNKNOWN_TOOLS off)",
            )
            return None
        return CallItem(names[name], name, json.dumps(arguments or {}, ensure_ascii=False))

    def value_type(self, name: str, key: str) -> str:
        raise NotImplementedError

    def format_complete(self, value: str, value_type: str) -> str:
        raise NotImplementedError

    def xml_to_json(self, raw: str, name: str) -> str:
        """_process_xml_to_json_streaming (glm4 346-464, glm47 423-536). The real loop goes character by character and
        checks whether its buffer now ends in the tag the state waits for; finding that tag in the held tail plus the
        new text gives the same transitions without re-copying a long key or junk on every character."""
        out: list[str] = []
        position = 0
        while position < len(raw):
            state = self.stream_state
            if state != "value":
                tag = TAG_AWAITED[state]
                keep = len(tag) - 1
                window = self.held_tail + raw[position:]
                found = window.find(tag)
                if found == -1:
                    self.held.append(raw[position:])
                    self.held_tail = window[-keep:]
                    break
                used = found + len(tag) - len(self.held_tail)
                self.held.append(raw[position : position + used])
                held = self.held.value
                self.held, self.held_tail = Text(), ""
                position += used
                if state == "key":
                    self.current_key = held[: -len(tag)].strip()
                    self.stream_state = "waiting"
                    out.append(json.dumps(self.current_key, ensure_ascii=False) + ": ")
                elif state == "waiting":
                    self.stream_state = "value"
                    self.current_value = Text()
                    self.xml_tag_buffer = ""
                    self.value_started = False
                    self.cached_value_type = self.value_type(name, self.current_key)
                else:
                    self.stream_state = "key"
                    self.current_key = ""
                    out.append("{" if self.is_first_param else ", ")
                    self.is_first_param = False
                continue
            if not self.xml_tag_buffer and raw[position] != "<":
                # characters that cannot start </arg_value> are flushed one by one by the real loop; a run of them
                # gives the same output at once
                run_end = raw.find("<", position)
                run_end = len(raw) if run_end == -1 else run_end
                out.append(self.stream_value(raw[position:run_end]))
                position = run_end
                continue
            self.xml_tag_buffer += raw[position]
            position += 1
            if self.xml_tag_buffer.endswith(ARG_VALUE_END):
                out.append(self.close_value(self.xml_tag_buffer[:-12], name))
                self.xml_tag_buffer = ""
                self.stream_state = "between"
                self.current_value = Text()
                self.value_started = False
                self.cached_value_type = None
            elif not (len(self.xml_tag_buffer) <= len(ARG_VALUE_END) and ARG_VALUE_END.startswith(self.xml_tag_buffer)):
                out.append(self.stream_value(self.xml_tag_buffer))
        return "".join(out)

    def close_value(self, final_value: str, name: str) -> str:
        self.current_value.append(final_value)
        value_type = self.cached_value_type or "string"
        if self.value_started:
            out = ""
            if final_value:
                out += json.dumps(final_value, ensure_ascii=False)[1:-1] if value_type == "string" else final_value
            return out + ('"' if value_type == "string" else "")
        return self.format_complete(self.current_value.value, value_type)

    def stream_value(self, content: str) -> str:
        value_type = self.cached_value_type or "string"
        if value_type == "string":
            out = "" if self.value_started else '"'
            self.value_started = True
            self.current_value.append(content)
            self.xml_tag_buffer = ""
            return out + json.dumps(content, ensure_ascii=False)[1:-1]
        self.value_started = True
        self.current_value.append(content)
        self.xml_tag_buffer = ""
        return content

    def not_a_call_yet(self, current: str) -> StreamResult | None:
        """No <tool_call> in the buffer: release it as text unless its end may start one (glm4 477-500)."""
        if BOT in current:
            return None
        if any(BOT.startswith(current[-size:]) for size in range(1, min(len(current), len(BOT)) + 1)):
            return StreamResult()
        self.buffer = ""
        if EOT in current:
            self.log.record(
                "drop_stray_tool_call_end",
                current,
                current.replace(EOT, ""),
                self.path,
                *self.lines["stray_eot"],
                "a </tool_call> outside a call is removed from streamed text",
            )
        return StreamResult(normal=current.replace(EOT, ""))

    def finish(self) -> StreamResult:
        """BaseFormatDetector.finish (base_format_detector.py:353-359): nothing held back for these detectors."""
        return StreamResult()

    # -- streaming, delta by delta
    def step(self) -> StreamResult:
        raise NotImplementedError

    def parse_delta(self, delta: str) -> StreamResult:
        """parse_streaming_increment. The real code re-reads its whole buffer on every delta, quadratic on a long call;
        while a delta cannot change the call's structure (no closing tag, no new name boundary) its effect is computed
        from the delta alone, which gives the same result; any other delta runs the faithful step on the buffer."""
        if self.mode is not None and self.fast_applies(self.tail + delta):
            return self.fast_delta(delta)
        if self.pending:
            self.buffer += "".join(self.pending)
            self.pending = []
        self.mode = None
        self.buffer += delta
        result = self.step()
        self.arm()
        return result

    def name_boundary(self, window: str) -> bool:
        """Whether text ending in `window` may end the pending name (and so change what the step does)."""
        raise NotImplementedError

    def stuck_on_empty_name(self) -> bool:
        """Whether the first call's name is complete and empty: the real detector then never trims its buffer and
        emits nothing more."""
        raise NotImplementedError

    def name_pending(self) -> bool:
        raise NotImplementedError

    def fast_applies(self, window: str) -> bool:
        if self.mode == "stuck":
            return True
        if self.mode == "held":
            # still no <tool_call>, and the text still ends like the start of one: the step keeps buffering
            end = window[-len(BOT) :]
            return BOT not in window and any(BOT.startswith(end[-size:]) for size in range(1, len(end) + 1))
        if self.mode == "name":
            return not self.name_boundary(window)
        return EOT not in window

    def arm(self) -> None:
        """After a real step: which fast mode, if any, the next deltas may take."""
        buffer = self.buffer
        self.total, self.tail = len(buffer), buffer[-len(EOT) :]
        if BOT not in buffer:
            if buffer:
                self.mode = "held"
            return
        if self.open_call is not None and self.current_tool_name_sent:
            if self.arm_arguments():
                self.mode = "args"
        elif self.stuck_on_empty_name():
            self.mode = "stuck"
        elif self.name_pending():
            self.mode = "name"

    def arm_arguments(self) -> bool:
        """Locate the stripped argument text (the step's `raw_args`) in the buffer."""
        assert self.open_call is not None
        start = self.open_call[1]
        region = self.buffer[start:]
        kept = region.lstrip()
        if kept:
            self.args_left = start + len(region) - len(kept)
            self.args_right = start + len(region.rstrip())
            self.spaces_from = self.args_right
        else:
            self.args_left, self.args_right, self.spaces_from = None, start, start
        self.spaces = self.buffer[self.spaces_from :]
        raw_length = self.args_right - self.args_left if self.args_left is not None else 0
        return self.arguments_buffered() or raw_length == self.streamed_raw_length

    def arguments_buffered(self) -> bool:
        return False

    def fast_delta(self, delta: str) -> StreamResult:
        self.total += len(delta)
        self.tail = (self.tail + delta)[-len(EOT) :]
        if self.mode == "stuck":
            return StreamResult()
        self.pending.append(delta)
        if self.mode in ("name", "held"):
            return StreamResult()
        assert self.open_call is not None
        # the new raw_args end: trailing whitespace waits until more text follows it
        base = self.spaces_from
        joined = self.spaces + delta
        if self.args_left is None:
            kept = joined.lstrip()
            if kept:
                self.args_left = base + len(joined) - len(kept)
        self.end_scan_pos = max(self.open_call[1], self.total - len(EOT) + 1)
        calls: list[CallItem] = []
        if self.args_left is None:
            self.spaces = joined
            return StreamResult()
        kept = joined.rstrip()
        if kept:
            self.args_right = base + len(kept)
        self.spaces_from = self.args_right
        self.spaces = joined[self.args_right - base :]
        raw_length = self.args_right - self.args_left
        if not self.arguments_buffered() and raw_length > self.streamed_raw_length:
            start = self.args_left + self.streamed_raw_length - base
            try:
                increment = self.xml_to_json(joined[start : self.args_right - base], self.open_call[0].strip())
            except Exception:
                # the step's own handler (glm4 643-645, glm47 866-868): the whole buffer comes out as text
                self.buffer += "".join(self.pending)
                self.pending, self.mode = [], None
                return StreamResult(normal=self.buffer)
            self.streamed_raw_length = raw_length
            if increment:
                index = self.current_tool_id
                calls.append(CallItem(index, None, increment))
                self.last_arguments.append(increment)
                self.streamed_args_for_tool[index].append(increment)
        return StreamResult(calls=calls)


class Glm4Detector(GlmDetectorBase):
    """Glm4MoeDetector (glm4_moe_detector.py:151-688): `<tool_call>name\\n<arg_key>…`."""

    path = GLM4
    lines = {"stray_eot": (495, 496), "content": (238, 239), "no_newline": (247, 249), "args": (88, 148)}
    STREAM_RE = re.compile(r"<tool_call>(.*?)(?:\\n|\n)(.*?)(</tool_call>|$)", re.DOTALL)
    DETAIL_RE = re.compile(r"<tool_call>(.*?)(?:\\n|\n)(.*)</tool_call>", re.DOTALL)

    # -- argument types and values
    def argument_type(self, name: str, key: str) -> str | None:
        """get_argument_type (37-67)."""
        by_name = dict(functions(self.tools))
        if name not in by_name:
            return None
        properties = schema_properties(by_name[name])
        if key not in properties:
            return None
        return infer_type(properties[key])

    def parse_value(self, raw: str, arg_type: str | None) -> tuple[Any, bool]:
        """parse_arguments (88-148): json.loads, unescape + json.loads, (string) strip quotes, literal_eval, text."""
        try:
            parsed = json.loads(raw)
            if arg_type == "number" and isinstance(parsed, str):
                parsed = to_number(parsed)
            return parsed, True
        except ValueError:
            pass
        try:
            parsed = json.loads(json.loads('{"tmp": "' + raw + '"}')["tmp"])
            if arg_type == "number" and isinstance(parsed, str):
                parsed = to_number(parsed)
            return parsed, True
        except (ValueError, KeyError):
            pass
        if arg_type == "string":  # Strategy 2.5 (124-134)
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
                return raw[1:-1], True
            return raw, True
        try:
            return literal_eval(raw), True
        except (ValueError, SyntaxError):
            pass
        return raw, True

    def parse_pairs(self, pairs: list[tuple[str, str]], name: str) -> dict:
        """_parse_argument_pairs (647-682): string-typed keys always end up strings (str(), or json.dumps)."""
        arguments: dict = {}
        for raw_key, raw_value in pairs:
            key = raw_key.strip()
            arg_type = self.argument_type(name, key)
            parsed, good = self.parse_value(raw_value, arg_type)
            if arg_type == "string":
                if isinstance(parsed, str):
                    arguments[key] = parsed
                elif isinstance(parsed, (dict, list)):
                    arguments[key] = json.dumps(parsed, ensure_ascii=False)
                else:
                    arguments[key] = str(parsed)
            else:
                arguments[key] = parsed if good else raw_value
        return arguments

    def value_type(self, name: str, key: str) -> str:
        """_get_value_type (266-317): the schema type; else a guess from the value, which is still empty here."""
        arg_type = self.argument_type(name, key)
        if arg_type:
            return arg_type
        content = self.current_value.value.strip()
        if not content:
            return "string"
        try:
            parsed = json.loads(content)
        except ValueError:
            first = content[0]
            if first.isdigit() or first in "-.":
                return "number"
            if first in "{[":
                return "object"
            return "string"
        if isinstance(parsed, dict):
            return "object"
        if isinstance(parsed, list):
            return "array"
        if isinstance(parsed, bool):
            return "boolean"
        if isinstance(parsed, (int, float)):
            return "number"
        if isinstance(parsed, str) and (parsed.isdigit() or (parsed.startswith("-") and parsed[1:].isdigit())):
            return "number"
        return "string"

    def format_complete(self, value: str, value_type: str) -> str:
        if value_type == "string":
            return json.dumps(value, ensure_ascii=False)
        if value_type == "number":
            return str(to_number(value.strip()))
        return value

    # -- non-streaming
    def parse_whole(self, text: str) -> tuple[str, list[CallItem]]:
        """detect_and_parse (230-264): content is the text before the first <tool_call>, stripped."""
        start = text.find(BOT)
        if start == -1:
            return text, []
        normal = text[:start].strip()
        self.log.record(
            "content_before_calls",
            text,
            normal,
            GLM4,
            *self.lines["content"],
            "content = text before the first <tool_call>, .strip(); everything after it is dropped",
        )
        calls: list[CallItem] = []
        try:
            for start, end in call_spans(text):
                block = text[start:end]
                detail = self.DETAIL_RE.search(block)
                if detail is None:
                    self.log.record(
                        "drop_call_without_newline",
                        block,
                        "",
                        GLM4,
                        *self.lines["no_newline"],
                        "the GLM-4.5 pattern needs a newline after the name: this call is dropped",
                    )
                    continue
                name, body = detail.group(1) or "", detail.group(2) or ""
                arguments = self.parse_pairs(ARG_PAIR_RE.findall(body), name)
                item = self.declared_call(name, arguments)
                if item is not None:
                    self.log.record(
                        "args_parse_dump",
                        body,
                        item.parameters,
                        GLM4,
                        *self.lines["args"],
                        f"{name}: values parsed by schema type and re-dumped (base_format_detector.py:94)",
                    )
                    calls.append(item)
        except Exception:  # detect_and_parse returns the text when parsing fails (261-264)
            self.log.edits.clear()
            return text, []
        return normal, calls

    # -- streaming
    def match_call(self, text: str) -> tuple[str, str, str, int] | None:
        """_match_tool_call (193-212): the open call's name and argument start are kept; only the tail is rescanned."""
        if self.open_call is None:
            match = self.STREAM_RE.search(text)
            if match is None:
                return None
            self.open_call = match.group(1), match.start(2)
            self.end_scan_pos = match.start(2)
        name, args_start = self.open_call
        end = END_RE.search(text, self.end_scan_pos)
        assert end is not None  # `$` always matches
        if end.group():
            self.open_call = None
        else:
            self.end_scan_pos = max(args_start, len(text) - len(EOT) + 1)
        return name, text[args_start : end.start()], end.group(), end.end()

    def step(self) -> StreamResult:
        """parse_streaming_increment (466-645) on the buffer, which already holds the delta."""
        current = self.buffer
        waiting = self.not_a_call_yet(current)
        if waiting is not None:
            return waiting
        calls: list[CallItem] = []
        try:
            match = self.match_call(current)
            if match:
                raw_name, raw_args, tool_end, match_end = match
                if raw_name is None or not raw_name.strip():
                    return StreamResult()
                name, raw_args = raw_name.strip(), raw_args.strip() if raw_args else ""
                self.start_call_tracking()
                if not self.current_tool_name_sent:
                    calls.append(CallItem(self.current_tool_id, name, ""))
                    self.current_tool_name_sent = True
                    self.streamed_raw_length = 0
                    self.reset_streaming_state()
                    self.prev_tool_call_arr[self.current_tool_id] = {"name": name, "arguments": {}}
                # arguments stream in the delta that sent the name (554-556)
                return StreamResult(calls=calls + self.stream_args(name, raw_args, tool_end, match_end, current))
            return StreamResult(calls=calls)
        except Exception:
            return StreamResult(normal=current)

    def name_boundary(self, window: str) -> bool:
        return "\n" in window or "\\n" in window

    def stuck_on_empty_name(self) -> bool:
        match = self.STREAM_RE.search(self.buffer)
        return match is not None and not match.group(1).strip()

    def name_pending(self) -> bool:
        return self.open_call is None and self.STREAM_RE.search(self.buffer) is None

    def start_call_tracking(self) -> None:
        if self.current_tool_id == -1:
            self.current_tool_id = 0
            self.prev_tool_call_arr = []
            self.streamed_args_for_tool = [Text()]
            self.streamed_raw_length = 0
            self.current_tool_name_sent = False
            self.reset_streaming_state()
        while len(self.prev_tool_call_arr) <= self.current_tool_id:
            self.prev_tool_call_arr.append({})
        while len(self.streamed_args_for_tool) <= self.current_tool_id:
            self.streamed_args_for_tool.append(Text())

    def stream_args(self, name: str, raw_args: str, tool_end: str, match_end: int, current: str) -> list[CallItem]:
        calls: list[CallItem] = []
        index = self.current_tool_id
        if len(raw_args) > self.streamed_raw_length:
            increment = self.xml_to_json(raw_args[self.streamed_raw_length :], name)
            self.streamed_raw_length = len(raw_args)
            if increment:
                calls.append(CallItem(index, None, increment))
                self.last_arguments.append(increment)
                self.streamed_args_for_tool[index].append(increment)
        if tool_end != EOT:
            return calls
        calls.extend(self.close_object())
        try:
            pairs = ARG_PAIR_RE.findall(raw_args)
            if pairs:
                self.prev_tool_call_arr[index]["arguments"] = self.parse_pairs(pairs, name)
        except Exception:
            pass
        self.buffer = current[match_end:]
        self.current_tool_id += 1
        self.last_arguments = Text()
        self.current_tool_name_sent = False
        self.streamed_raw_length = 0
        self.reset_streaming_state()
        return calls

    def close_object(self) -> list[CallItem]:
        """586-614: "{}" for a call without arguments, else the closing brace."""
        index = self.current_tool_id
        text = "{}" if self.is_first_param else "}"
        self.last_arguments.append(text)
        self.streamed_args_for_tool[index].append(text)
        return [CallItem(index, None, text)]


class Glm47Detector(GlmDetectorBase):
    """Glm47MoeDetector (glm47_moe_detector.py:301-965): `<tool_call>name<arg_key>…`."""

    path = GLM47
    lines = {"stray_eot": (782, 783), "content": (368, 384), "args": (249, 298)}
    STREAM_RE = re.compile(r"<tool_call>(.*?)(?:(<arg_key.*?))?(?:(</tool_call>)|$)", re.DOTALL)
    DETAIL_RE = re.compile(r"<tool_call>(.*?)(<arg_key>.*?)?</tool_call>", re.DOTALL)

    def reset_streaming_state(self) -> None:
        super().reset_streaming_state()
        self.tool_call_completed = False
        self.sent_empty_object = False
        self.buffer_arguments: bool | None = None

    # -- argument types and values
    def argument_type(self, name: str, key: str, arguments: dict | None = None) -> str | None:
        """get_argument_type (164-173): the one type the schema allows, "number" for number|integer, else None."""
        types = tool_argument_types(name, key, self.tools, arguments)
        if types == {"number", "integer"}:
            return "number"
        return next(iter(types)) if types and len(types) == 1 else None

    def parse_value(self, raw: str, arg_type: str | None) -> tuple[Any, bool]:
        """parse_arguments (249-298), with numeric strings coerced to the schema type (238-246)."""
        try:
            return self.coerce_numeric(json.loads(raw), arg_type), True
        except ValueError:
            pass
        try:
            return self.coerce_numeric(json.loads(json.loads('{"tmp": "' + raw + '"}')["tmp"]), arg_type), True
        except (ValueError, KeyError):
            pass
        if arg_type == "string":
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
                return raw[1:-1], True
            return raw, True
        try:
            return literal_eval(raw), True
        except (ValueError, SyntaxError):
            pass
        return raw, True

    @staticmethod
    def coerce_numeric(value: Any, arg_type: str | None) -> Any:
        if isinstance(value, str):
            if arg_type == "integer":
                try:
                    return int(value)
                except (ValueError, AttributeError):
                    return value
            if arg_type == "number":
                return to_number(value)
        return value

    def needs_context(self, name: str) -> bool:
        return any(n == name and needs_argument_context(p) for n, p in functions(self.tools))

    def parse_pairs(self, pairs: list[tuple[str, str]], name: str) -> dict:
        """_parse_argument_pairs (872-937): a string-typed key keeps the raw text unless it parses to a string."""
        arguments: dict = {}
        known: dict = {}
        if len(pairs) > 1 and self.needs_context(name):
            for raw_key, raw in pairs:
                key = raw_key.strip()
                parsed = self.parse_pairs([(key, raw)], name)[key]
                native = tool_argument_types(name, key, self.tools, value=raw)
                if isinstance(parsed, str) or native is None or "string" not in native:
                    known[key] = parsed
        for raw_key, raw_value in pairs:
            key = raw_key.strip()
            arg_type = self.argument_type(name, key, known)
            parsed, good = self.parse_value(raw_value, arg_type or "string")
            if arg_type == "string":
                arguments[key] = parsed if isinstance(parsed, str) else raw_value
            elif arg_type is None:
                allowed = tool_argument_types(name, key, self.tools, known, parsed)
                native = tool_argument_types(name, key, self.tools, known, raw_value)
                inadmissible = allowed is not None and json_kind(parsed) not in allowed
                if inadmissible and native is not None and "string" in native:
                    parsed = raw_value
                arguments[key] = parsed if good else raw_value
            else:
                arguments[key] = parsed if good else raw_value
            known[key] = arguments[key]
        return arguments

    def value_type(self, name: str, key: str) -> str:
        return self.argument_type(name, key) or "auto"

    def format_complete(self, value: str, value_type: str) -> str:
        return json.dumps(value, ensure_ascii=False) if value_type == "string" else value

    def close_value(self, final_value: str, name: str) -> str:
        value_type = self.cached_value_type or "string"
        if value_type in ("auto", "number", "integer"):
            # typed values are parsed once closed (478-482)
            self.current_value.append(final_value)
            parsed = self.parse_pairs([(self.current_key, self.current_value.value)], name)[self.current_key]
            return json.dumps(parsed, ensure_ascii=False)
        return super().close_value(final_value, name)

    def stream_value(self, content: str) -> str:
        if (self.cached_value_type or "string") in ("auto", "number", "integer"):
            self.current_value.append(content)
            self.xml_tag_buffer = ""
            return ""
        return super().stream_value(content)

    # -- non-streaming
    def parse_whole(self, text: str) -> tuple[str, list[CallItem]]:
        """detect_and_parse (357-410): content is all text outside complete calls, joined and stripped."""
        if BOT not in text:
            return text, []
        outside, last = [], 0
        spans = call_spans(text)
        for start, end in spans:
            if start > last:
                outside.append(text[last:start])
            last = end
        if last < len(text):
            outside.append(text[last:])
        normal = "".join(outside).strip()
        self.log.record(
            "content_outside_calls",
            text,
            normal,
            GLM47,
            *self.lines["content"],
            "content = all text outside complete calls, joined and .strip()",
        )
        calls: list[CallItem] = []
        try:
            for start, end in spans:
                detail = self.DETAIL_RE.search(text[start:end])
                if detail is None:
                    continue
                name, body = detail.group(1) or "", detail.group(2) or ""
                arguments = self.parse_pairs(ARG_PAIR_RE.findall(body), name) if body else {}
                item = self.declared_call(name, arguments)
                if item is not None:
                    self.log.record(
                        "args_parse_dump",
                        body,
                        item.parameters,
                        GLM47,
                        *self.lines["args"],
                        f"{name}: values parsed by schema type and re-dumped (base_format_detector.py:94)",
                    )
                    calls.append(item)
        except Exception:  # 407-410
            self.log.edits.clear()
            return text, []
        return normal, calls

    # -- streaming
    def match_call(self, text: str) -> tuple[str, str, str, int] | None:
        """_match_tool_call (552-574)."""
        if self.open_call is None:
            match = self.STREAM_RE.search(text)
            if match is None:
                return None
            if match.group(2) is None or match.group(3):
                return match.group(1).strip(), (match.group(2) or "").strip(), match.group(3) or "", match.end()
            self.open_call = match.group(1).strip(), match.start(2)
            self.end_scan_pos = match.start(2)
        name, args_start = self.open_call
        end = END_RE.search(text, self.end_scan_pos)
        assert end is not None  # `$` always matches
        if end.group():
            self.open_call = None
        else:
            self.end_scan_pos = max(args_start, len(text) - len(EOT) + 1)
        return name, text[args_start : end.start()].strip(), end.group(), end.end()

    def step(self) -> StreamResult:
        """parse_streaming_increment (753-870) on the buffer, which already holds the delta."""
        current = self.buffer
        waiting = self.not_a_call_yet(current)
        if waiting is not None:
            return waiting
        normal = ""
        first = current.find(BOT)
        if first > 0:
            normal, current = current[:first], current[first:]
            self.buffer = current
        calls: list[CallItem] = []
        try:
            match = self.match_call(current)
            if not match:
                return StreamResult(normal=normal)
            name, raw_args, tool_end, match_end = match
            if self.current_tool_id == -1:
                self.current_tool_id = 0
                self.prev_tool_call_arr = []
                self.streamed_args_for_tool = [Text()]
                self.streamed_raw_length = 0
                self.current_tool_name_sent = False
                self.reset_streaming_state()
            while len(self.prev_tool_call_arr) <= self.current_tool_id:
                self.prev_tool_call_arr.append({})
            while len(self.streamed_args_for_tool) <= self.current_tool_id:
                self.streamed_args_for_tool.append(Text())
            if not self.current_tool_name_sent and ("<arg_key" in current or tool_end == EOT) and name:
                # _send_tool_name_if_needed (576-617): the name is complete; it is not checked against the tools
                self.current_tool_name_sent = True
                self.streamed_raw_length = 0
                self.reset_streaming_state()
                self.prev_tool_call_arr[self.current_tool_id] = {"name": name, "arguments": {}}
                calls.append(CallItem(self.current_tool_id, name, ""))
            if self.current_tool_name_sent:
                item = self.stream_arguments(name, raw_args)
                if item is not None:
                    calls.append(item)
                if tool_end == EOT and not self.tool_call_completed:
                    calls.extend(self.finalize(name, raw_args, match_end, current))
                    return StreamResult(normal, calls)
        except Exception:
            return StreamResult(normal=current)
        return StreamResult(normal, calls)

    def name_boundary(self, window: str) -> bool:
        return "<arg_key" in window or EOT in window

    def stuck_on_empty_name(self) -> bool:
        if self.current_tool_name_sent or not self.buffer.startswith(BOT):
            return False
        match = self.STREAM_RE.search(self.buffer)
        return match is not None and not match.group(1).strip() and bool(match.group(2) or match.group(3))

    def name_pending(self) -> bool:
        buffer = self.buffer
        return (
            self.open_call is None
            and not self.current_tool_name_sent
            and buffer.startswith(BOT)
            and "<arg_key" not in buffer
            and EOT not in buffer
        )

    def arguments_buffered(self) -> bool:
        return bool(self.buffer_arguments)

    def arm_arguments(self) -> bool:
        return self.buffer.startswith(BOT) and self.buffer_arguments is not None and super().arm_arguments()

    def stream_arguments(self, name: str, raw_args: str) -> CallItem | None:
        """_process_arguments_streaming (619-666)."""
        if self.buffer_arguments is None:
            self.buffer_arguments = self.needs_context(name)
        if self.buffer_arguments or len(raw_args) <= self.streamed_raw_length:
            return None
        increment = self.xml_to_json(raw_args[self.streamed_raw_length :], name)
        self.streamed_raw_length = len(raw_args)
        if not increment:
            return None
        self.last_arguments.append(increment)
        self.streamed_args_for_tool[self.current_tool_id].append(increment)
        return CallItem(self.current_tool_id, None, increment)

    def finalize(self, name: str, raw_args: str, match_end: int, current: str) -> list[CallItem]:
        """_finalize_tool_call (668-751)."""
        index = self.current_tool_id
        calls: list[CallItem] = []
        if self.buffer_arguments:
            serialized = json.dumps(self.parse_pairs(ARG_PAIR_RE.findall(raw_args), name), ensure_ascii=False)
            calls.append(CallItem(index, None, serialized))
            self.last_arguments.append(serialized)
            self.streamed_args_for_tool[index].append(serialized)
            self.sent_empty_object = True
        closing = self.closing_text()
        if closing:
            calls.append(CallItem(index, None, closing))
            self.last_arguments.append(closing)
            self.streamed_args_for_tool[index].append(closing)
            self.sent_empty_object = True
        if raw_args:
            try:
                pairs = ARG_PAIR_RE.findall(raw_args)
                if pairs:
                    self.prev_tool_call_arr[index]["arguments"] = self.parse_pairs(pairs, name)
            except Exception:
                pass
        self.buffer = current[match_end:]
        self.tool_call_completed = True
        self.current_tool_id += 1
        self.last_arguments = Text()
        self.current_tool_name_sent = False
        self.streamed_raw_length = 0
        self.reset_streaming_state()
        return calls

    def closing_text(self) -> str:
        """704-728: "{}" for a call without arguments, else the closing brace of the streamed object."""
        if self.sent_empty_object:
            return ""
        return "{}" if self.is_first_param else "}"


# ---------------------------------------------------------------- the serving layer
class Accumulated:
    """What a client gets by concatenating the streamed chunks (ids per serving_chat.py:3720-3731)."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, tuple[list[str | None], list[str], list[str]]] = {}

    def add_call(self, index: int, name: str | None, arguments: str) -> None:
        ids, names, args = self.calls.setdefault(index, ([None], [], []))
        if name and ids[0] is None:
            ids[0] = RANDOM_ID
        names.append(name or "")
        args.append(arguments or "")

    def turn(self) -> ParsedTurn:
        calls = tuple(
            ToolCall(ids[0], "".join(names), "".join(args)) for _, (ids, names, args) in sorted(self.calls.items())
        )
        return ParsedTurn("".join(self.reasoning) or None, "".join(self.content) or None, calls)


class SglangGlmParser(FamilyParser):
    """serving_chat.py's reasoning + tool-call chain for the GLM family."""

    # Glm45Detector: the reasoning base with force_reasoning, <tool_call> also ending reasoning
    reasoning_class: type[ReasoningDetector] = ReasoningDetector
    reasoning_lines = {"leading_think": (171, 173), "tool_split": (179, 191)}
    detectors: dict[str, type[GlmDetectorBase]] = {"glm45": Glm4Detector, "glm47": Glm47Detector}
    unstreamed_lines = (3758, 3833)

    def reasoner(self, log: EditLog) -> ReasoningDetector:
        return self.reasoning_class(BOT, True, True, log, leading_think_lines=self.reasoning_lines["leading_think"],
                                    tool_split_lines=self.reasoning_lines["tool_split"])

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        detector = self.detectors[self.tool_parser](tools, log) if self.tool_parser and tools else None
        if stream:
            return self.parse_stream(text, detector, chunks, log)
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning, text = self.reasoner(log).detect_and_parse(text)
        calls: tuple[ToolCall, ...] = ()
        if detector is not None and BOT in text:
            # the detector's edits count only when serving_chat uses its result
            detector.log = EditLog(log.origin)
            normal, items = detector.parse_whole(text)
            # function_call_parser.py:218-221: a call marker alone replaces the text
            log.edits.extend(detector.log.edits)
            text = normal
            calls = tuple(ToolCall(RANDOM_ID, item.name or "", item.parameters) for item in items)
        # serving_chat.py:2986-2993: content is never null; empty reasoning is reported as null
        return ParsedTurn(reasoning or None, text, calls)

    def parse_stream(self, text: str, detector: GlmDetectorBase | None, chunks: list[str], log: EditLog) -> ParsedTurn:
        reasoner = self.reasoner(log) if self.reasoning_parser is not None else None
        out = Accumulated()
        deltas = special_token_deltas(text, chunks, SPECIAL_RE)
        for position, delta in enumerate(deltas):
            finished = position == len(deltas) - 1
            if reasoner is not None:
                reasoning, delta = reasoner.stream(delta)
                if finished:  # parse_stream_end / finish (since 0.5.13)
                    end_reasoning, end_normal = reasoner.finish()
                    reasoning, delta = reasoning + end_reasoning, delta + end_normal
                out.reasoning.append(reasoning)
            if detector is None:
                out.content.append(delta)
                continue
            result = detector.parse_delta(delta)
            if finished:
                end_result = detector.finish()
                result = StreamResult(result.normal + end_result.normal, result.calls + end_result.calls)
            out.content.append(result.normal)
            for item in result.calls:
                out.add_call(item.index, item.name, item.parameters)
            if finished:
                try:
                    self.unstreamed_arguments(detector, out, log)
                except (TypeError, ValueError) as exc:
                    # not a ValueError the stream handler turns into an error chunk (2799-2803): the stream breaks
                    return ParsedTurn(
                        None,
                        None,
                        (),
                        error=f"sglang: the stream fails at its end: the last call's parsed arguments cannot be "
                        f"JSON-encoded ({type(exc).__name__}: {exc})",
                    )
        return out.turn()

    def unstreamed_arguments(self, detector: GlmDetectorBase, out: Accumulated, log: EditLog) -> None:
        """_check_for_unstreamed_tool_args (serving_chat.py:3758-3833): the last call's parsed arguments minus what
        was streamed, when what was streamed is a prefix of them."""
        if not detector.prev_tool_call_arr or not detector.streamed_args_for_tool:
            return
        index = len(detector.prev_tool_call_arr) - 1
        if index >= len(detector.streamed_args_for_tool):
            return
        expected = detector.prev_tool_call_arr[index].get("arguments", {})
        expected = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        actual = detector.streamed_args_for_tool[index].value
        remaining = expected[len(actual) :] if expected.startswith(actual) else ""
        if remaining:
            log.record(
                "unstreamed_args_appended",
                actual,
                actual + remaining,
                SERVING,
                *self.unstreamed_lines,
                "arguments parsed but not streamed are sent at the end",
            )
            out.add_call(index, None, remaining)
