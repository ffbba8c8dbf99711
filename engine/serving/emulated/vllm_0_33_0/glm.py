"""vLLM 0.33.0 GLM-4.5 … 5.1: `--reasoning-parser glm45|glm47 --tool-call-parser glm45|glm47`.

All four names load one class, Glm47MoeParser (vllm/parser/glm47_moe.py), a config for the declarative parser engine
(vllm/parser/engine/*). The serving layer wraps it twice (registered_adapters.py:95-98) and DelegatingParser
(vllm/parser/abstract_parser.py:344-1051) runs the two copies one after the other: a reasoning pass with tool parsing
switched off, which leaves the tool markup in the content, then a tool pass over that content.

This module replays both passes the way the engine does: a lexer that holds back a possible tag prefix at the end of
a delta (incremental_lexer.py), the state machine of glm47_moe.py:132-232, the event-to-delta rules of
parser_engine.py (deferred text after a call, whitespace-only content, trailing reasoning whitespace) and the
argument conversion and streaming (glm47_moe.py:67-111, parser_engine.py:347-462, 1071-1141). Streaming runs delta by
delta; every special token is one delta, as a model emits it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import special_token_deltas, tool_schema
from engine.serving.emulated.vllm_0_33_0.parser_engine import Event, Lexer, name_and_arguments, safe_argument_prefix
from engine.serving.emulated.vllm_0_33_0.schema_coercion import coerce_dict, streamable_string_keys, tool_properties
from engine.types import ToolCall

GLM = "vllm/parser/glm47_moe.py"
ENGINE = "vllm/parser/engine/parser_engine.py"
STREAMING = "vllm/parser/engine/streaming_parser_engine.py"
DELEGATING = "vllm/parser/abstract_parser.py"
RANDOM_ID = "chatcmpl-tool-<uuid>"

THINK_START, THINK_END = "<think>", "</think>"
TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
ARG_KEY_START, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE_START, ARG_VALUE_END = "<arg_value>", "</arg_value>"
# The GLM-4.7/5.x tokenizer's added tokens flagged special (tokenizer.json). The engine drops every special token its
# grammar does not name (streaming_parser_engine.py:39-86, 415-417), e.g. a stop token left in the text.
DROPPED_SPECIALS = (
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
GRAMMAR_TOKENS = (THINK_START, THINK_END, TOOL_START, TOOL_END)
GRAMMAR_TOKENS += (ARG_KEY_START, ARG_KEY_END, ARG_VALUE_START, ARG_VALUE_END)
SPECIAL_TOKENS = GRAMMAR_TOKENS + DROPPED_SPECIALS
SPECIAL_RE = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))

# parser states (parser_engine_config.py:32-39) and semantic events (events.py:11-19)
CONTENT, REASONING, TOOL_NAME, TOOL_ARGS = "content", "reasoning", "tool_name", "tool_args"
TOOL_STATES = (TOOL_NAME, TOOL_ARGS)
TEXT, THOUGHT, THOUGHT_START, THOUGHT_END = "text", "reasoning", "reasoning_start", "reasoning_end"
CALL_START, NAME, ARGS, CALL_END = "call_start", "name", "args", "call_end"
STATE_EVENT = {CONTENT: TEXT, REASONING: THOUGHT, TOOL_NAME: NAME, TOOL_ARGS: ARGS}
DROP = "drop"

ARG_RE = re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>", re.DOTALL)
PARTIAL_ARG_RE = re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*)$", re.DOTALL)
NAME_IN_ARGS_RE = re.compile(r'"name"\s*:\s*"([^"]*)"')



def split_special_tokens(text: str) -> list[str]:
    """Text and special tokens in order, each special token alone: how the tokenizer sees the model's output."""
    pieces: list[str] = []
    position = 0
    for match in SPECIAL_RE.finditer(text):
        if match.start() > position:
            pieces.append(text[position : match.start()])
        pieces.append(match.group())
        position = match.end()
    if position < len(text):
        pieces.append(text[position:])
    return pieces


# ---------------------------------------------------------------- schema helpers (tool_parsers/utils.py)
def declares_tool(tools: list[dict], name: object) -> bool:
    return isinstance(name, str) and tool_schema(tools, name) is not None


# ---------------------------------------------------------------- argument conversion (glm47_moe.py:67-111)
class RawArgs:
    """A call's raw argument text, growing at the end, with _glm47_parse_args (glm47_moe.py:67-86) kept up to date.

    Why incremental: the engine re-parses the whole argument text on most deltas, which is quadratic on a long call.
    A complete `<arg_key>…</arg_value>` match never changes when text is appended (a new earlier match would need a
    closing tag the old match already offered), so matching resumes after the last complete one; and text without
    `<` or `>` cannot complete or open a tag, so it only extends the open value."""

    def __init__(self) -> None:
        self.parts: list[str] = []  # all of it, joined only on demand
        self.fresh: list[str] = []  # appended since the last parse
        self.unmatched: list[str] = []  # after the last complete match
        self.between = ""  # text outside complete matches before that (what ARG_RE.sub leaves there)
        self.complete: dict[str, str] = {}
        self.open_key: str | None = None
        self.open_value: list[str] = []
        self.parsed = False
        self.name_fresh: list[str] = []
        self.name_window: list[str] = []
        self.name_found: str | None = None

    def append(self, text: str) -> None:
        self.parts.append(text)
        self.fresh.append(text)
        self.name_fresh.append(text)

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def last_chars(self, count: int) -> str:
        picked: list[str] = []
        size = 0
        for part in reversed(self.parts):
            picked.append(part)
            size += len(part)
            if size >= count:
                break
        return "".join(reversed(picked))[-count:] if count else ""

    def params(self, partial: bool) -> tuple[dict[str, str], str | None]:
        """Keys stripped, values kept raw; with `partial` the open trailing value is included."""
        new = "".join(self.fresh)
        self.fresh.clear()
        if self.parsed and "<" not in new and ">" not in new:
            self.unmatched.append(new)
            if self.open_key is not None:
                self.open_value.append(new)
        else:
            tail = "".join(self.unmatched) + new
            start = 0
            for match in ARG_RE.finditer(tail):
                self.between += tail[start : match.start()]
                self.complete[match.group("key").strip()] = match.group("value")
                start = match.end()
            self.unmatched = [tail[start:]]
            self.open_key, self.open_value = None, []
            match = PARTIAL_ARG_RE.search(self.between + tail[start:])
            if match and match.group("key").strip():
                self.open_key, self.open_value = match.group("key").strip(), [match.group("value")]
            self.parsed = True
        params = dict(self.complete)
        if partial and self.open_key is not None:
            params[self.open_key] = "".join(self.open_value)
            return params, self.open_key
        return params, None

    def convert(self, partial: bool) -> str:
        return json.dumps(self.params(partial)[0], ensure_ascii=False)

    def name_field(self) -> str | None:
        """parser_engine.py:1143-1151: a `"name": "…"` inside the arguments names a call whose name is empty.

        The first match never moves once found, and a new one must end at a quote in the new text and hold only
        four quotes, so the search window starts three quotes before the new text."""
        new = "".join(self.name_fresh)
        self.name_fresh.clear()
        if self.name_found is not None or '"' not in new:
            self.name_window.append(new)
            return self.name_found or None
        window = "".join(self.name_window) + new
        match = NAME_IN_ARGS_RE.search(window)
        if match is not None:
            self.name_found = match.group(1)
            return self.name_found or None
        start = len(window)
        for _ in range(3):
            start = window.rfind('"', 0, start)
            if start <= 0:
                start = 0
                break
        self.name_window = [window[start:]]
        return None


def open_value_extender(args: RawArgs) -> Callable[[str], str | None] | None:
    """glm47_moe.py:93-111: while the last value is open, a delta appends its JSON-escaped text."""
    params, open_key = args.params(partial=True)
    if open_key is None or next(reversed(params)) != open_key:
        return None
    keep = len(ARG_VALUE_END) - 1
    tail = args.last_chars(keep)

    def extend(delta: str) -> str | None:
        nonlocal tail
        joined = tail + delta
        if ARG_VALUE_END in joined:
            return None
        tail = joined[-keep:]
        return json.dumps(delta, ensure_ascii=False)[1:-1]

    return extend


# ---------------------------------------------------------------- the engine (lexer + state machine)
def transitions(thinking: bool) -> dict[tuple[str, str], tuple[str, tuple[str, ...]]]:
    """glm47_moe.py:132-232: (state, terminal) -> (next state, events)."""
    table: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
        (REASONING, THINK_START): (REASONING, ()),
        (REASONING, TOOL_START): (TOOL_NAME, (THOUGHT_END, CALL_START)),
        (CONTENT, TOOL_START): (TOOL_NAME, (CALL_START,)),
        (TOOL_NAME, ARG_KEY_START): (TOOL_ARGS, (ARGS,)),
        (TOOL_NAME, TOOL_END): (CONTENT, (CALL_END,)),
        (TOOL_ARGS, TOOL_END): (CONTENT, (CALL_END,)),
    }
    for tag in (ARG_KEY_START, ARG_KEY_END, ARG_VALUE_START, ARG_VALUE_END):
        table[(TOOL_ARGS, tag)] = (TOOL_ARGS, (ARGS,))
    if thinking:
        table[(CONTENT, THINK_START)] = (REASONING, (THOUGHT_START,))
        table[(REASONING, THINK_END)] = (CONTENT, (THOUGHT_END,))
        table[(CONTENT, THINK_END)] = (CONTENT, ())
    return table


@dataclass(frozen=True)
class MachineGrammar:
    """What a Machine reads but never changes: built once per thinking mode instead of once per parse."""

    table: Mapping
    literals: Mapping[str, str]
    by_token: frozenset[str]
    tool_terminals: frozenset[str]
    reasoning_markup: frozenset[str]


@cache
def machine_grammar(thinking: bool) -> MachineGrammar:
    table = transitions(thinking)
    grammar = [TOOL_START, TOOL_END, ARG_KEY_START, ARG_KEY_END, ARG_VALUE_START, ARG_VALUE_END]
    if thinking:
        grammar = [THINK_START, THINK_END, *grammar]
    literals: dict[str, str] = {t: t for t in grammar}
    literals.update({t: DROP for t in DROPPED_SPECIALS})
    return MachineGrammar(
        table=MappingProxyType(table),
        literals=MappingProxyType(literals),
        # token-id terminals (glm47_moe.py:193-197) and dropped specials arrive pre-lexed by token id
        by_token=frozenset({t for t in literals if t in (THINK_START, THINK_END, TOOL_START, TOOL_END)}
                           | set(DROPPED_SPECIALS)),
        tool_terminals=frozenset(t for (s, t), (n, _) in table.items() if n in TOOL_STATES or s in TOOL_STATES),
        reasoning_markup=frozenset({THINK_START, THINK_END}) if thinking else frozenset(),
    )


class Machine:
    """StreamingParserEngine for the GLM config: incremental lexer (incremental_lexer.py:82-285) plus the transition
    table; one instance per pass, as each adapter owns its own engine."""

    def __init__(self, thinking: bool, log: EditLog) -> None:
        self.log = log
        grammar = machine_grammar(thinking)
        self.table = grammar.table
        self.literals = grammar.literals
        self.by_token = grammar.by_token
        self.lexer_literals = list(grammar.literals.items())
        self.tool_terminals = grammar.tool_terminals
        self.reasoning_markup = grammar.reasoning_markup
        self.skip_tools = False
        self.skip_reasoning = False
        self.reset(None)

    def reset(self, initial_state: str | None) -> None:
        self.state = initial_state or (REASONING if THINK_START in self.literals else CONTENT)
        self.tool_index = -1
        self.lexer = Lexer(self.lexer_literals)

    def _run(self, tokens: list[tuple[str | None, str]]) -> list[Event]:
        events: list[Event] = []
        for terminal, value in tokens:
            if terminal is None:
                if value:
                    events.extend(self.emit(value))
            else:
                events.extend(self.on_terminal(terminal, value))
        return events

    def feed(self, delta: str) -> list[Event]:
        if delta in self.by_token:
            # a special token: held text is flushed first (streaming_parser_engine.py:276-278)
            events = self._run(self.lexer.flush())
            return events + self.on_terminal(self.literals[delta], delta)
        return self._run(self.lexer.feed(delta))

    def feed_text(self, text: str) -> list[Event]:
        events: list[Event] = []
        for piece in split_special_tokens(text):
            events.extend(self.feed(piece))
        return events

    def finish(self) -> list[Event]:
        """streaming_parser_engine.py:294-349: flush held text, close an open call or reasoning block."""
        events = self._run(self.lexer.flush())
        if self.state in TOOL_STATES:
            if self.tool_index >= 0:
                events.append(Event(CALL_END, "", self.tool_index))
            self.state = CONTENT
        elif self.state == REASONING:
            events.append(Event(THOUGHT_END, "", self.tool_index))
            self.state = CONTENT
        return events

    # -- state machine (streaming_parser_engine.py:410-584)
    def emit(self, text: str) -> list[Event]:
        return [Event(STATE_EVENT[self.state], text, self.tool_index)]

    def on_terminal(self, terminal: str, value: str) -> list[Event]:
        step = self.table.get((self.state, terminal))
        if step is None:
            if terminal == DROP:
                self.log.record(
                    "drop_special_token", value, "", STREAMING, 415, 417, f"{value} is not in the grammar: dropped"
                )
                return []
            return self.emit(value)
        if self.skip_reasoning and terminal in self.reasoning_markup:
            return self.emit(value)
        next_state, kinds = step
        if self.skip_tools and terminal in self.tool_terminals and next_state in TOOL_STATES:
            # the reasoning pass forwards tool markup as text; <tool_call> still ends reasoning (426-476)
            if THOUGHT_END in kinds:
                self.state = CONTENT
                return [Event(THOUGHT_END, value, self.tool_index), Event(TEXT, value, self.tool_index)]
            return self.emit(value)
        if not kinds and self.state == CONTENT and terminal == THINK_END:
            self.log.record(
                "drop_think_end_in_content", value, "", GLM, 172, 175, "a </think> after reasoning ended is dropped"
            )
        self.state = next_state
        events = []
        for kind in kinds:
            if kind == CALL_START:
                self.tool_index += 1
            events.append(Event(kind, value, self.tool_index))
        return events


# ---------------------------------------------------------------- the parser (parser_engine.py)
class Slot:
    """One tool call being parsed (parser_engine.py:59-108)."""

    def __init__(self) -> None:
        self.id = ""
        self.name_parts: list[str] = []
        self.args = RawArgs()
        self.name_sent = False
        self.string_keys: set[str] | None = None
        self.streamed_parts: list[str] = []
        self.extend: Callable[[str], str | None] | None = None
        self.open_value_streams = False

    @property
    def name(self) -> str:
        if len(self.name_parts) != 1:
            self.name_parts = ["".join(self.name_parts)]
        return self.name_parts[0]

    @name.setter
    def name(self, value: str) -> None:
        self.name_parts = [value]

    @property
    def streamed(self) -> str:
        if len(self.streamed_parts) != 1:
            self.streamed_parts = ["".join(self.streamed_parts)]
        return self.streamed_parts[0]

    @streamed.setter
    def streamed(self, value: str) -> None:
        self.streamed_parts = [value]


@dataclass
class Delta:
    content: str | None = None
    reasoning: str | None = None
    calls: list[tuple[int, str | None, str | None, str | None]] = field(default_factory=list)


@dataclass
class Extracted:
    calls: list[tuple[str, str, str]]  # id, name, arguments
    content: str | None


class Pass:
    """One ParserEngine instance (the reasoning adapter's or the tool adapter's)."""

    def __init__(self, tools: list[dict], thinking: bool, log: EditLog) -> None:
        self.tools = tools
        self.log = log
        self.machine = Machine(thinking, log)
        self.has_reasoning = thinking
        self.streaming_initialized = False
        # the non-streaming parse reads the final arguments from the raw body (1170-1191); the streamed JSON only
        # decides whether a delta exists, which the name alone already does, so it is not computed there
        self.stream_args = True
        self.reset(None)

    def reset(self, initial_state: str | None) -> None:
        self.machine.reset(initial_state)
        self.reasoning_ended = not self.has_reasoning
        self.slots: list[Slot] = []
        self.deferred_content = ""
        self.deferred_reasoning = ""
        self.content_has_nonws = False

    def initialize_streaming(self, initial_state: str | None) -> None:
        if not self.streaming_initialized:
            self.streaming_initialized = True
            self.reset(initial_state)

    # -- names and arguments
    def accept(self, name: object) -> bool:
        """validate_tool_names=True (glm47_moe.py:231; parser_engine.py:464-472): with tools, only declared names."""
        return bool(name) and (not self.tools or declares_tool(self.tools, name))

    def fix_types(self, args_json: str, name: str) -> str:
        """parser_engine.py:437-462: coerce string values to the schema and re-dump only if something changed."""
        if not self.tools or not name:
            return args_json
        try:
            args = json.loads(args_json)
        except ValueError:
            return args_json
        if not isinstance(args, dict):
            return args_json
        properties = tool_properties(self.tools, name)
        if not properties or not coerce_dict(args, properties):
            return args_json
        return json.dumps(args, ensure_ascii=False)

    def extract_name(self, slot: Slot) -> str | None:
        return slot.args.name_field()

    def send_name(self, index: int, calls: list, name: str | None) -> None:
        if name is not None:
            name = name.strip()  # glm47_moe.py:268-271
        if name is None or not self.accept(name):
            return
        slot = self.slots[index]
        slot.name, slot.name_sent = name, True
        slot.string_keys = streamable_string_keys(tool_properties(self.tools, name))
        slot.id = slot.id or RANDOM_ID
        calls.append((index, slot.id, name, None))

    def on_args(self, event: Event, calls: list) -> None:
        slot = self.slots[event.index]
        if event.value:
            slot.args.append(event.value)
        if not slot.name_sent:
            if slot.name:
                self.send_name(event.index, calls, slot.name)
            elif event.value:
                self.send_name(event.index, calls, self.extract_name(slot))
        elif event.value and self.stream_args:
            diff = self.arg_delta(slot, event.value)
            if diff:
                calls.append((event.index, None, None, diff))

    def arg_delta(self, slot: Slot, raw: str) -> str | None:
        """parser_engine.py:1071-1117."""
        if slot.extend is not None:
            diff = slot.extend(raw)
            if diff is not None:
                if not diff or not slot.open_value_streams:
                    return None
                slot.streamed_parts.append(diff)
                return diff
            slot.extend = None
        current = slot.args.convert(True)
        if slot.name:
            current = self.fix_types(current, slot.name)
        previous = slot.streamed
        safe, value_streams = safe_argument_prefix(current, slot.string_keys)
        if not safe or (previous and not safe.startswith(previous)):
            return None
        slot.streamed = safe
        slot.extend = open_value_extender(slot.args)
        slot.open_value_streams = value_streams
        return safe[len(previous) :] or None

    def flush_args(self, slot: Slot) -> str | None:
        """parser_engine.py:1119-1141: the rest of the final JSON, unless the streamed prefix no longer matches."""
        final = slot.args.convert(False)
        if final:
            final = self.fix_types(final, slot.name)
        previous = slot.streamed
        if final and len(final) > len(previous):
            if previous and not final.startswith(previous):
                self.log.record(
                    "args_stream_diverged",
                    final,
                    previous,
                    ENGINE,
                    1134,
                    1137,
                    "the final arguments no longer extend what was streamed: the rest is never sent",
                )
                return None
            slot.streamed = final
            return final[len(previous) :]
        return None

    def on_call_end(self, event: Event, calls: list) -> None:
        index = event.index
        if 0 <= index < len(self.slots):
            self.slots[index].name = self.slots[index].name.strip()  # glm47_moe.py:273-277
        if index >= len(self.slots):
            return
        slot = self.slots[index]
        remaining = self.flush_args(slot) if self.stream_args else None
        if not slot.name_sent:
            name = slot.name or self.extract_name(slot) or ""
            if self.accept(name):
                slot.name, slot.name_sent = name, True
                slot.string_keys = streamable_string_keys(tool_properties(self.tools, name))
                slot.id = slot.id or RANDOM_ID
                calls.append((index, slot.id, name, remaining or ""))
                remaining = None
        if remaining and slot.name_sent:
            calls.append((index, None, None, remaining))

    # -- events to one client delta (parser_engine.py:837-923)
    def to_delta(self, events: list[Event], finished: bool) -> Delta | None:
        if not events and not self.deferred_content:
            return None
        calls: list[tuple[int, str | None, str | None, str | None]] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = self.deferred_content
        seen_tool_event = False
        for event in events:
            if event.kind == TEXT:
                if seen_tool_event:
                    self.deferred_content += event.value
                else:
                    content_parts.append(event.value)
            elif event.kind == THOUGHT:
                reasoning_parts.append(event.value)
            elif event.kind == THOUGHT_END:
                self.reasoning_ended = True
            elif event.kind == CALL_START:
                seen_tool_event = True
                while len(self.slots) <= event.index:
                    self.slots.append(Slot())
            elif event.kind == NAME:
                seen_tool_event = True
                self.slots[event.index].name_parts.append(event.value)
            elif event.kind == ARGS:
                seen_tool_event = True
                self.on_args(event, calls)
            elif event.kind == CALL_END:
                seen_tool_event = True
                self.on_call_end(event, calls)
        if self.deferred_content and (not seen_tool_event or not calls):
            fresh = self.deferred_content[len(carried) :]
            if carried:
                content_parts.insert(0, carried)
            if fresh:
                content_parts.append(fresh)
            self.deferred_content = ""
        content = "".join(content_parts)
        if not self.content_has_nonws and content:
            if content.strip():
                self.content_has_nonws = True
            elif self.slots:
                self.log.record(
                    "drop_ws_content_before_tools",
                    content,
                    "",
                    ENGINE,
                    898,
                    909,
                    "whitespace-only content while a tool call is open or done is dropped",
                )
                content = ""
            elif not finished:
                self.deferred_content, content = content, ""
        reasoning = "".join(reasoning_parts)
        if content or calls or reasoning:
            return Delta(content or None, reasoning or None, calls)
        return None

    def strip_trailing_reasoning(self, delta: Delta | None) -> Delta | None:
        """parser_engine.py:533-561: trailing whitespace of reasoning waits for more reasoning, else is dropped."""
        if delta is not None and delta.reasoning is not None:
            combined = self.deferred_reasoning + delta.reasoning
            trimmed = combined.rstrip()
            self.deferred_reasoning = combined[len(trimmed) :]
            delta.reasoning = trimmed or None
            if delta.reasoning is None and delta.content is None and not delta.calls:
                return None
        elif self.deferred_reasoning and self.reasoning_ended:
            self.log.record(
                "reasoning_rstrip",
                self.deferred_reasoning,
                "",
                ENGINE,
                533,
                561,
                "trailing whitespace of the reasoning is never streamed",
            )
            self.deferred_reasoning = ""
        return delta

    # -- entry points
    def stream(self, delta: str, initial_state: str | None) -> Delta | None:
        self.initialize_streaming(initial_state)
        return self.strip_trailing_reasoning(self.to_delta(self.machine.feed(delta), finished=False))

    def stream_text(self, text: str) -> Delta | None:
        """A delta whose text may hold several tokens (the text the reasoning pass hands over)."""
        return self.strip_trailing_reasoning(self.to_delta(self.machine.feed_text(text), finished=False))

    def finish_streaming(self) -> Delta | None:
        events = self.machine.finish()
        if events or self.deferred_content:
            return self.to_delta(events, finished=True)
        return None

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """parser_engine.py:565-590 with tool parsing skipped (adapters.py:82-89)."""
        self.reset(None)
        self.machine.skip_tools = True
        events = self.machine.feed_text(text) + self.machine.finish()
        reasoning = "".join(e.value for e in events if e.kind == THOUGHT)
        content = "".join(e.value for e in events if e.kind == TEXT)
        stripped = reasoning.rstrip()
        self.log.record("reasoning_rstrip", reasoning, stripped, ENGINE, 585, 588, "reasoning.rstrip()")
        return stripped or None, content or None

    def extract_from_content(self, content: str) -> Extracted:
        """parser_engine.py:628-651 -> _single_pass_parse (776-804) in CONTENT state, then the call list (1155-1206)."""
        self.reset(CONTENT)
        self.stream_args = False
        events = self.machine.feed_text(content) + self.machine.finish()
        delta = self.to_delta(events, finished=True)
        if self.deferred_content:
            self.log.record(
                "drop_text_after_call",
                self.deferred_content,
                "",
                ENGINE,
                855,
                894,
                "text after a tool call is deferred and never returned by the non-streaming parse",
            )
        calls = self.final_calls()
        text = delta.content if delta else None
        if text:
            stripped = text.strip() if calls else text
            self.log.record(
                "content_strip", text, stripped, ENGINE, 488, 498, "content.strip() because tool calls are present"
            )
            text = stripped
        return Extracted(calls, text or None)

    def final_calls(self) -> list[tuple[str, str, str]]:
        calls = []
        for slot in self.slots:
            raw = slot.args.text
            if not slot.name and not raw:
                continue
            name: object = slot.name.strip()
            if not name and raw.strip():
                name, args_json = name_and_arguments(raw)
            elif raw.strip():
                args_json = slot.args.convert(False)
                open_value = slot.args.params(True)[1]
                if open_value is not None:
                    self.log.record(
                        "drop_open_value",
                        raw,
                        args_json,
                        GLM,
                        76,
                        84,
                        f"{name}: the unterminated value of {open_value!r} is left out of the arguments",
                    )
                else:
                    self.log.record(
                        "args_raw_values_dumped",
                        raw,
                        args_json,
                        GLM,
                        67,
                        90,
                        f"{name}: keys stripped, values kept as raw strings, json.dumps(ensure_ascii=False)",
                    )
            else:
                args_json = "{}"
            if not self.accept(name):
                self.log.record(
                    "drop_undeclared_call",
                    f"{TOOL_START}{name}{raw}{TOOL_END}",
                    "",
                    ENGINE,
                    464,
                    472,
                    f"{name!r} is not a declared tool (validate_tool_names, glm47_moe.py:231): the call is dropped",
                )
                continue
            fixed = self.fix_types(args_json, str(name))
            self.log.record(
                "args_schema_coerce",
                args_json,
                fixed,
                ENGINE,
                437,
                462,
                f"{name}: values coerced to the tool schema (utils.py:1153-1242) and re-dumped",
            )
            calls.append((slot.id or RANDOM_ID, str(name), fixed))
        return calls


# ---------------------------------------------------------------- the serving layer (DelegatingParser)
class Accumulated:
    """What a client gets by concatenating the streamed deltas."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, tuple[list[str | None], list[str], list[str]]] = {}  # index -> id, name, arguments

    def add(self, delta: Delta | None) -> None:
        if delta is None:
            return
        self.reasoning.append(delta.reasoning or "")
        self.content.append(delta.content or "")
        for index, call_id, name, arguments in delta.calls:
            ids, names, args = self.calls.setdefault(index, ([None], [], []))
            if call_id and ids[0] is None:
                ids[0] = call_id
            names.append(name or "")
            args.append(arguments or "")

    def turn(self) -> ParsedTurn:
        calls = tuple(
            ToolCall(ids[0], "".join(names), "".join(args)) for _, (ids, names, args) in sorted(self.calls.items())
        )
        return ParsedTurn("".join(self.reasoning) or None, "".join(self.content) or None, calls)


class VllmGlmParser(FamilyParser):
    """DelegatingParser over the two Glm47MoeParser adapters (abstract_parser.py:344-1051)."""

    @property
    def thinking(self) -> bool:
        """chat_template_kwargs `thinking`/`enable_thinking` switch the grammar (glm47_moe.py:244-265): on unless
        one of them is set, then on if either is truthy (GLM-5.1's template has the switch, so the GLM-5.3 override
        at 247-256 does not apply)."""
        thinking = self.chat_template_kwargs.get("thinking")
        enable_thinking = self.chat_template_kwargs.get("enable_thinking")
        if thinking is None and enable_thinking is None:
            return True
        return bool(thinking) or bool(enable_thinking)

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        if stream:
            return self.parse_stream(text, tools, chunks, log)
        return self.parse_whole(text, tools, log)

    # -- non-streaming: abstract_parser.py:841-855 and 391-491
    def parse_whole(self, text: str, tools: list[dict], log: EditLog) -> ParsedTurn:
        if self.reasoning_parser is not None and self.thinking:
            reasoning, content = Pass(tools, self.thinking, log).extract_reasoning(text)
        else:
            reasoning, content = None, text
        if self.tool_parser is None:
            return ParsedTurn(reasoning, content, ())
        tool_pass = Pass(tools, self.thinking, log)
        tool_pass.machine.skip_reasoning = self.reasoning_parser is None
        extracted = tool_pass.extract_from_content(content or "")
        if not extracted.calls:
            # engine-based parsers return the tool pass's content, without unfinished call markup (487-488)
            if extracted.content != content:
                log.record(
                    "drop_unparsed_markup",
                    content or "",
                    extracted.content or "",
                    DELEGATING,
                    481,
                    488,
                    "the tool pass's content replaces the text: unfinished call markup is gone",
                )
            return ParsedTurn(reasoning, extracted.content or None, ())
        content = extracted.content
        if content is not None and not content.strip():
            content = None
        calls = tuple(ToolCall(i, n, a) for i, n, a in extracted.calls)
        return ParsedTurn(reasoning, content, calls)

    # -- streaming: abstract_parser.py:857-1051
    def parse_stream(self, text: str, tools: list[dict], chunks: list[str], log: EditLog) -> ParsedTurn:
        reasoner = Pass(tools, self.thinking, log) if self.reasoning_parser is not None else None
        if reasoner is not None:
            reasoner.machine.skip_tools = True
        caller = Pass(tools, self.thinking, log) if self.tool_parser is not None else None
        if caller is not None and reasoner is None:
            caller.machine.skip_reasoning = True
        out = Accumulated()
        # the prompt ends inside <think> (or has no reasoning parser): reasoning is open at the start (869-882)
        reasoning_ended = reasoner is None or not self.thinking
        tool_text_started = False
        deltas = special_token_deltas(text, chunks, SPECIAL_RE)
        for position, delta_text in enumerate(deltas):
            finished = position == len(deltas) - 1
            message: Delta | None = None
            transitioned = False
            current_text = delta_text
            if not reasoning_ended and reasoner is not None:
                message = reasoner.stream(delta_text, None)
                if reasoner.reasoning_ended:
                    reasoning_ended = transitioned = True
                    flushed = reasoner.finish_streaming()
                    current_text = ((message.content if message else None) or "") + (
                        (flushed.content if flushed else None) or ""
                    )
                    if caller is not None:
                        if message is not None:
                            message.content = None
                    elif current_text:
                        message = message or Delta()
                        message.content = current_text
            if reasoning_ended and caller is not None:
                first = not tool_text_started
                tool_text_started = True
                carried_reasoning = message.reasoning if message else None
                caller.initialize_streaming(CONTENT)
                message = caller.stream_text(current_text) if first else caller.stream(delta_text, CONTENT)
                if carried_reasoning:
                    if message is None:
                        message = Delta(reasoning=carried_reasoning)
                    elif not message.reasoning:
                        message.reasoning = carried_reasoning
            if message is None and not transitioned and reasoning_ended and caller is None:
                message = Delta(content=delta_text)  # no phase active: the raw delta is content (984-990)
            out.add(message)
            if finished:
                # _flush_engine_parsers (1015-1051): the reasoning pass only while reasoning is still open
                if reasoner is not None and not reasoning_ended:
                    out.add(reasoner.finish_streaming())
                if caller is not None:
                    out.add(caller.finish_streaming())
        turn = out.turn()
        return ParsedTurn(turn.reasoning, turn.content, turn.calls)
