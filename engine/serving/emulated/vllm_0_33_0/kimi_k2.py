"""vLLM 0.33.0 Kimi K2.x: `--reasoning-parser kimi_k2 --tool-call-parser kimi_k2`.

Both names resolve to KimiK2Parser (vllm/parser/kimi_k2.py), a grammar for the declarative parser engine
(vllm/parser/engine/*). ParserManager wraps it in a DelegatingParser (parser/abstract_parser.py) over the two adapters
of parser/engine/adapters.py, so one request runs two engine instances:
- the reasoning engine reads the whole output with tool parsing switched off and splits reasoning from content;
- the tool engine reads that content from the CONTENT state and extracts the calls.
Streaming feeds the same two engines chunk by chunk (DelegatingParser.parse_delta, abstract_parser.py:857-1007).
Several results depend on where chunks end (held-back reasoning whitespace, a lexer prefix released at the end), so
this module models the engine's lexer, state machine and delta assembly for Kimi's grammar and drives them the way
the real classes are driven, instead of computing the result from the whole text.

Call ids are the model's own `functions.<name>:<N>` headers (kimi_k2.py:179-205). The request's history count is
read only by the DelegatingParser's stream state, never by the tool engine that makes the ids, so it changes nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import keep_special_tokens_whole, tool_schema
from engine.serving.emulated.vllm_0_33_0.schema_coercion import coerce_dict
from engine.types import ToolCall

KIMI = "vllm/parser/kimi_k2.py"
ENGINE = "vllm/parser/engine/parser_engine.py"
STREAMING = "vllm/parser/engine/streaming_parser_engine.py"
DELEGATING = "vllm/parser/abstract_parser.py"

THINK_START, THINK_END = "<think>", "</think>"
SECTION_START, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_START, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARG_START = "<|tool_call_argument_begin|>"
IM_END = "<|im_end|>"
# The tokenizer's special tokens the oracle registered (tests/conformance/corpus.py): each is one token, so a
# detokenized delta never splits one. Any of them that the grammar does not name is dropped by the engine.
SPECIAL_TOKENS = (THINK_START, THINK_END, SECTION_START, SECTION_END, CALL_START, CALL_END, ARG_START, IM_END)
LONGEST_TOKEN = max(len(token) for token in SPECIAL_TOKENS)
LITERAL_RE = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS))

# parser states (parser_engine_config.py:32-39)
REASONING, CONTENT, PREAMBLE, NAME, ARGS, BETWEEN = "reasoning", "content", "preamble", "name", "args", "between"
TOOL_STATES = frozenset({PREAMBLE, NAME, ARGS, BETWEEN})
DROP = "drop"
# text events per state (parser_engine_config.py:70-77); TOOL_PREAMBLE / TOOL_BETWEEN emit nothing
STATE_EVENT = {CONTENT: "text", REASONING: "reasoning", NAME: "name"}
TOOL_TERMINALS = frozenset({SECTION_START, SECTION_END, CALL_START, CALL_END, ARG_START})

TOOL_ID_RE = re.compile(r"(?P<id>.+:\d+)")  # kimi_k2.py:49, matched at the start of the stripped header
STRING_STOP_RE = re.compile(r'["\\]')
STRUCTURE_RE = re.compile(r'["{}\[\]]')

DROP_REASONS = {
    "think_start_in_reasoning": (KIMI, 64, 67, "a repeated <think> inside reasoning is consumed by the grammar"),
    "think_end_in_content": (KIMI, 72, 75, "a </think> after reasoning ended is consumed by the grammar"),
    "special_token": (STREAMING, 39, 86, "a special token the grammar does not name is dropped (416-417)"),
    "tool_section_text": (
        KIMI,
        131,
        140,
        "text inside or after the tool-call section is suppressed (no text event in that state, "
        "streaming_parser_engine.py:501-511)",
    ),
}


class RequestFails(Exception):
    """Where the real engine raises out of the parser, so the request fails instead of returning a message."""


def transitions(thinking: bool) -> dict[tuple[str, str], tuple[str, tuple[str, ...]]]:
    """Kimi's grammar (kimi_k2.py:52-148): (state, terminal) -> (next state, events)."""
    table = {
        (REASONING, SECTION_START): (PREAMBLE, ("reasoning_end",)),
        (CONTENT, SECTION_START): (PREAMBLE, ()),
        (PREAMBLE, CALL_START): (NAME, ("call_start",)),
        (NAME, ARG_START): (ARGS, ()),
        (ARGS, CALL_END): (BETWEEN, ("call_end",)),
        (ARGS, SECTION_END): (PREAMBLE, ("call_end",)),
        (BETWEEN, CALL_START): (NAME, ("call_start",)),
        (PREAMBLE, SECTION_END): (PREAMBLE, ()),
        (BETWEEN, SECTION_END): (PREAMBLE, ()),
    }
    if thinking:
        table[(REASONING, THINK_START)] = (REASONING, ())
        table[(REASONING, THINK_END)] = (CONTENT, ("reasoning_end",))
        table[(CONTENT, THINK_END)] = (CONTENT, ())
    return table


def thinking_enabled(chat_template_kwargs: dict | None) -> bool:
    """kimi_k2.py:160-167: thinking unless `thinking` / `enable_thinking` says otherwise."""
    kwargs = chat_template_kwargs or {}
    thinking, enable = kwargs.get("thinking"), kwargs.get("enable_thinking")
    return True if thinking is None and enable is None else bool(thinking) or bool(enable)


def split_special_tokens(text: str, specials: tuple[str, ...] = SPECIAL_TOKENS) -> list[tuple[str, bool]]:
    """The text as (piece, is_special_token) in order; the detokenizer gives each special token its own id."""
    if "<" not in text:  # every special token starts with "<"
        return [(text, False)] if text else []
    pattern = LITERAL_RE if specials == SPECIAL_TOKENS else re.compile("|".join(map(re.escape, specials)))
    pieces: list[tuple[str, bool]] = []
    position = 0
    for match in pattern.finditer(text):
        if match.start() > position:
            pieces.append((text[position : match.start()], False))
        pieces.append((match.group(), True))
        position = match.end()
    if position < len(text):
        pieces.append((text[position:], False))
    return pieces


class DropLog:
    """Text the engine throws away, by reason, for the edit log."""

    def __init__(self) -> None:
        self.items: list[tuple[str, list[str]]] = []  # consecutive drops of one reason are one edit

    def add(self, reason: str, text: str) -> None:
        if not text:
            return
        if self.items and self.items[-1][0] == reason:
            self.items[-1][1].append(text)
        else:
            self.items.append((reason, [text]))

    def record(self, log: EditLog, which: str) -> None:
        for reason, parts in self.items:
            path, line, end_line, description = DROP_REASONS[reason]
            log.record(f"drop_{reason}", "".join(parts), "", path, line, end_line, f"{which}: {description}")


@dataclass
class Event:
    kind: str  # text, reasoning, reasoning_end, call_start, name, args, call_end
    value: str = ""
    index: int = -1
    # for "args": positions (in value) of held closing brackets that did not end a flush of their own
    held: tuple[int, ...] = ()


class KimiGrammar:
    """StreamingParserEngine (streaming_parser_engine.py:89-737) configured by kimi_k2_config: lexer, state machine
    and the JSON-argument flush, reduced to what Kimi's grammar uses."""

    def __init__(self, thinking: bool, skip_tool_parsing: bool, drops: DropLog, skip_reasoning_parsing: bool) -> None:
        self.thinking = thinking
        self.skip_tool_parsing = skip_tool_parsing
        # with no reasoning parser configured, <think>/</think> are plain text for the tool engine (abstract_parser.py
        # 156-166); both are reasoning-only markers in Kimi's grammar (streaming_parser_engine.py:382-407)
        self.skip_reasoning_parsing = skip_reasoning_parsing
        self.drops = drops
        self.table = transitions(thinking)
        named = [SECTION_START, SECTION_END, CALL_START, CALL_END, ARG_START] + (
            [THINK_START, THINK_END] if thinking else []
        )
        # every other registered special token is a DROP terminal (_build_drop_info, 39-86)
        self.literals = {token: (token if token in named else DROP) for token in SPECIAL_TOKENS}
        self.prefixes = {token[:i] for token in SPECIAL_TOKENS for i in range(1, len(token))}
        self.reset(REASONING if thinking else CONTENT)

    def reset(self, state: str) -> None:
        self.state = state
        self.tool_index = -1
        self.token_mode = False  # _ever_had_token_ids: text-matched terminals then count as plain text (359-360)
        self.held = ""  # the incremental lexer's buffer (incremental_lexer.py:184-271)
        self.args_held = ""
        self.args_depth = 0
        self.args_in_string = False
        self.args_escape = False

    # ---- input
    def feed(self, pieces: list[tuple[str, bool]], has_token_ids: bool) -> list[Event]:
        if has_token_ids:
            self.token_mode = True
        events: list[Event] = []
        for text, special in pieces:
            if special:  # a pre-lexed terminal: the lexer is flushed first (streaming_parser_engine.py:276-278)
                events += self.lex(final=True)
                events += self.on_terminal(self.literals[text], text)
            elif not self.held and "<" not in text:  # nothing can start a terminal: plain text for the state
                events += self.on_content(text)
            else:
                self.held += text
                events += self.lex(final=False)
        return events

    def finish(self) -> list[Event]:
        """streaming_parser_engine.py:294-349."""
        events = self.lex(final=True)
        if self.args_held:
            events.append(Event("args", self.args_held, self.tool_index))
            self.args_held = ""
        if self.state in TOOL_STATES:
            if self.tool_index >= 0:
                events.append(Event("call_end", "", self.tool_index))
            self.state = CONTENT
        elif self.state == REASONING:
            events.append(Event("reasoning_end", "", self.tool_index))
            self.state = CONTENT
        return events

    # ---- lexer: literal terminals, a trailing strict prefix of one is held until more text arrives
    def lex(self, final: bool) -> list[Event]:
        buffer, events, position = self.held, [], 0
        for match in LITERAL_RE.finditer(buffer):
            if match.start() > position:
                events += self.on_content(buffer[position : match.start()])
            literal = match.group()
            if self.token_mode:  # strict mode: a terminal that did not come as a token id is plain text
                events += self.on_content(literal)
            else:
                events += self.on_terminal(self.literals[literal], literal)
            position = match.end()
        self.held = ""
        if not final:  # the first "<" whose rest of the buffer is a strict prefix of a marker is held back
            lt = buffer.find("<", max(position, len(buffer) - LONGEST_TOKEN))
            while lt != -1 and buffer[lt:] not in self.prefixes:
                lt = buffer.find("<", lt + 1)
            if lt != -1:
                self.held = buffer[lt:]
                buffer = buffer[:lt]
        if len(buffer) > position:
            events += self.on_content(buffer[position:])
        return events

    # ---- state machine (_on_terminal 409-481, _emit_for_state 483-511, _apply_transition 518-584)
    def on_content(self, text: str) -> list[Event]:
        return self.emit(text) if text else []

    def on_terminal(self, terminal: str, value: str) -> list[Event]:
        transition = self.table.get((self.state, terminal))
        if transition is None:
            if terminal == DROP:
                self.drops.add("special_token", value)
                return []
            return self.emit(value)
        next_state, kinds = transition
        if self.skip_reasoning_parsing and terminal in (THINK_START, THINK_END):
            return self.emit(value)
        if self.skip_tool_parsing and terminal in TOOL_TERMINALS:
            # the reasoning pass keeps tool markup as text; a section start still ends reasoning (426-476)
            if "reasoning_end" in kinds:
                self.state = CONTENT
                return [Event("reasoning_end", value, self.tool_index), Event("text", value, self.tool_index)]
            kind = STATE_EVENT.get(self.state)
            return [Event(kind, value, self.tool_index)] if kind else []
        return self.apply(next_state, kinds, terminal, value)

    def apply(self, next_state: str, kinds: tuple[str, ...], terminal: str, value: str) -> list[Event]:
        events: list[Event] = []
        if self.state == ARGS and next_state != ARGS and self.args_held:
            events.append(Event("args", self.args_held, self.tool_index))
            self.args_held = ""
        if not kinds and terminal == THINK_START and self.state == REASONING:
            self.drops.add("think_start_in_reasoning", value)
        if not kinds and terminal == THINK_END and self.state == CONTENT:
            self.drops.add("think_end_in_content", value)
        self.state = next_state
        for kind in kinds:
            if kind == "call_start":
                self.tool_index += 1
            events.append(Event(kind, value, self.tool_index))
        if self.state == ARGS:
            self.args_depth, self.args_in_string, self.args_escape = 0, False, False
        return events

    def emit(self, text: str) -> list[Event]:
        if self.state == ARGS:
            return self.feed_args(text)
        kind = STATE_EVENT.get(self.state)
        if kind is None:
            self.drops.add("tool_section_text", text)
            return []
        return [Event(kind, text, self.tool_index)]

    def feed_args(self, text: str) -> list[Event]:
        """_feed_args_char (598-633): every character flushes the buffer except a closing bracket that returns to
        depth 0, which is held until the next character (or a transition / the end) confirms it."""
        combined = self.args_held + text
        held = list(range(len(self.args_held)))
        flushed = 0
        position = len(self.args_held)
        while position < len(combined):
            if self.args_escape:
                self.args_escape = False
                position += 1
                flushed = position
                continue
            if self.args_in_string:
                match = STRING_STOP_RE.search(combined, position)
                if match is None:
                    position = flushed = len(combined)
                    break
                if combined[match.start()] == "\\":
                    self.args_escape = True
                else:
                    self.args_in_string = False
                position = flushed = match.start() + 1
                continue
            match = STRUCTURE_RE.search(combined, position)
            if match is None:
                position = flushed = len(combined)
                break
            index = match.start()
            if index > position:
                flushed = index
            char = combined[index]
            if char == '"':
                self.args_in_string = True
                flushed = index + 1
            elif char in "{[":
                self.args_depth += 1
                flushed = index + 1
            else:
                if self.args_depth > 0:
                    self.args_depth -= 1
                if self.args_depth == 0:
                    held.append(index)
                else:
                    flushed = index + 1
            position = index + 1
        self.args_held = combined[flushed:]
        if not flushed:
            return []
        return [Event("args", combined[:flushed], self.tool_index, tuple(i for i in held if i < flushed))]


@dataclass
class Delta:
    """DeltaMessage, reduced: content, reasoning and tool-call deltas [index, id, name, arguments]."""

    content: str | None = None
    reasoning: str | None = None
    calls: list[list] = field(default_factory=list)


class NameScan:
    """`"name"\\s*:\\s*"([^"]*)"` (parser_engine.py:1143) searched in growing arguments without rescanning them.

    Only the leftmost match counts (regex search); once found it never changes, so the value is kept, even empty.
    """

    KEY = '"name"'

    def __init__(self) -> None:
        self.window = ""  # text not yet ruled out: from the current candidate, or the last few characters
        self.value: list[str] | None = None  # pieces of the value once its opening quote is seen
        self.found: str | None = None

    def extend(self, more: str) -> str | None:
        if self.found is not None:
            return self.found
        if self.value is not None:
            end = more.find('"')
            if end == -1:
                self.value.append(more)
                return None
            self.value.append(more[:end])
            self.found = "".join(self.value)
            return self.found
        self.window += more
        while True:
            start = self.window.find(self.KEY)
            if start == -1:
                self.window = self.window[-(len(self.KEY) - 1) :]
                return None
            outcome, position = self.after_key(start + len(self.KEY))
            if outcome == "value":
                rest, self.window, self.value = self.window[position:], "", []
                return self.extend(rest)
            if outcome == "pending":
                self.window = self.window[start:]
                return None
            self.window = self.window[start + 1 :]

    def after_key(self, position: int) -> tuple[str, int]:
        """After the key: whitespace, ':', whitespace, '"'. Returns value / pending / failed."""
        window = self.window
        for wanted in (":", '"'):
            while position < len(window) and window[position].isspace():
                position += 1
            if position == len(window):
                return "pending", position
            if window[position] != wanted:
                return "failed", position
            position += 1
        return "value", position


@dataclass
class Slot:
    """ToolCallSlot (parser_engine.py:59-108)."""

    id: str = ""
    name_parts: list[str] = field(default_factory=list)  # the header as it streams in, joined on first read
    args: list[str] = field(default_factory=list)
    name_sent: bool = False
    names: NameScan = field(default_factory=NameScan)

    @property
    def name(self) -> str:
        if len(self.name_parts) > 1:
            self.name_parts = ["".join(self.name_parts)]
        return self.name_parts[0] if self.name_parts else ""

    @name.setter
    def name(self, value: str) -> None:
        self.name_parts = [value]

    @property
    def raw_args(self) -> str:
        return "".join(self.args)


def extract_tool_id_and_name(header: str | None) -> tuple[str | None, str | None]:
    """kimi_k2.py:179-189."""
    if header is None:
        return None, None
    match = TOOL_ID_RE.match(header.strip())
    if not match:
        return None, None
    tool_id = match.group("id").strip()
    return tool_id, tool_id.split(":")[0].removeprefix("functions.")


class KimiEngine:
    """One KimiK2Parser instance (ParserEngine, parser_engine.py:111-1243, with kimi_k2.py's overrides) as one adapter
    of the DelegatingParser uses it."""

    def __init__(
        self, thinking: bool, tools: list[dict], skip_tool_parsing: bool, drops: DropLog, skip_reasoning: bool = False
    ) -> None:
        self.grammar = KimiGrammar(thinking, skip_tool_parsing, drops, skip_reasoning)
        self.tools = tools
        self.drops = drops
        self.has_reasoning = thinking  # _has_reasoning (143-148)
        self.initialized = False
        self.id_count = 0  # the engine's own StreamState.history_tool_call_cnt: nobody seeds it from the request
        self.ws_dropped: list[str] = []
        self.raw_reasoning: list[str] = []  # every reasoning event, before the trailing-whitespace strip
        self.reset(None)

    def reset(self, state: str | None) -> None:
        self.grammar.reset(state or (REASONING if self.has_reasoning else CONTENT))
        self.reasoning_ended = not self.has_reasoning
        self.slots: list[Slot] = []
        self.deferred: list[str] = []  # _deferred_content, as parts
        self.deferred_ws = True  # every deferred part is whitespace
        self.deferred_reasoning: list[str] = []
        self.content_has_nonws = False

    def initialize_streaming(self, state: str | None) -> None:
        if not self.initialized:
            self.initialized = True
            self.reset(state)

    # ---- events -> delta (_events_to_delta, 837-923)
    def events_to_delta(self, events: list[Event], finished: bool = False) -> Delta | None:
        """Content held back by the engine is kept as parts (joined only when released), so whitespace streamed
        before a call costs O(its length), not O(length) per chunk."""
        if not events and not self.deferred:
            return None
        calls: list[list] = []
        content_parts: list[str] = []
        after_tool: list[str] = []  # text after a tool event in this delta waits for the next one (855-856)
        reasoning_parts: list[str] = []
        seen_tool_event = False
        for event in events:
            if event.kind == "text":
                (after_tool if seen_tool_event else content_parts).append(event.value)
            elif event.kind == "reasoning":
                reasoning_parts.append(event.value)
                self.raw_reasoning.append(event.value)
            elif event.kind == "reasoning_end":
                self.reasoning_ended = True
            elif event.kind == "call_start":
                seen_tool_event = True
                while len(self.slots) <= event.index:
                    self.slots.append(Slot())
            elif event.kind == "name":
                seen_tool_event = True
                self.slots[event.index].name_parts.append(event.value)
            elif event.kind == "args":
                seen_tool_event = True
                self.handle_args(event, calls)
            elif event.kind == "call_end":
                seen_tool_event = True
                self.handle_tool_end(event.index, calls)
        if len(calls) > 1:
            calls = coalesce(calls)
        parts = content_parts
        parts_ws = all(not part.strip() for part in content_parts)
        if (self.deferred or after_tool) and (not seen_tool_event or not calls):
            # carried content goes first, this delta's late text last (885-894)
            parts_ws = parts_ws and self.deferred_ws and all(not part.strip() for part in after_tool)
            self.deferred.extend(content_parts)
            self.deferred.extend(after_tool)
            parts, self.deferred, self.deferred_ws = self.deferred, [], True
        else:
            self.deferred.extend(after_tool)
            self.deferred_ws = self.deferred_ws and all(not part.strip() for part in after_tool)
        content = ""
        if self.content_has_nonws:
            content = "".join(parts)
        elif any(parts):
            if not parts_ws:
                self.content_has_nonws = True
                content = "".join(parts)
            elif self.slots:  # drop_whitespace_only_content_before_tools (kimi_k2.py:145)
                self.ws_dropped.extend(parts)
            elif not finished:
                self.deferred, self.deferred_ws = parts, True
            else:
                content = "".join(parts)
        reasoning = "".join(reasoning_parts) or None
        if content or calls or reasoning:
            return Delta(content or None, reasoning, calls)
        return None

    def handle_args(self, event: Event, calls: list[list]) -> None:
        slot = self.slots[event.index]
        if slot.name_sent:  # flush boundaries no longer matter: every piece is streamed as it is
            slot.args.append(event.value)
            calls.append([event.index, None, None, event.value])
            return
        start = 0
        held = set(event.held)
        for position in range(len(event.value)):
            if position in held:
                continue
            self.handle_arg_piece(event.index, event.value[start : position + 1], calls)
            start = position + 1
            if slot.name_sent:  # the rest streams as it is; one piece or many gives the same text
                if start < len(event.value):
                    slot.args.append(event.value[start:])
                    calls.append([event.index, None, None, event.value[start:]])
                return

    def handle_arg_piece(self, index: int, piece: str, calls: list[list]) -> None:
        """kimi_k2.py:218-235 over parser_engine.py:967-993 (no arg converter: raw deltas)."""
        slot = self.slots[index]
        sent_before = slot.name_sent
        slot.args.append(piece)
        found = slot.names.extend(piece)
        if not slot.name_sent:
            if slot.name:
                self.emit_name(index, calls, slot.name)
            elif piece:
                self.emit_name(index, calls, found or None)
        elif piece:
            calls.append([index, None, None, piece])
        if piece and not sent_before and slot.name_sent:
            calls.append([index, None, None, piece])

    def emit_name(self, index: int, calls: list[list], header: str | None) -> None:
        """kimi_k2.py:191-205 then parser_engine.py:943-965."""
        tool_id, tool_name = extract_tool_id_and_name(header)
        if not tool_name:
            if 0 <= index < len(self.slots):
                self.slots[index].name = ""
            return
        slot = self.slots[index]
        slot.id = tool_id or ""
        slot.name = tool_name
        slot.name_sent = True
        self.ensure_id(slot, tool_name)
        calls.append([index, slot.id, tool_name, None])

    def handle_tool_end(self, index: int, calls: list[list]) -> None:
        """kimi_k2.py:207-216 then parser_engine.py:995-1035."""
        if 0 <= index < len(self.slots) and not self.slots[index].name_sent:
            tool_id, tool_name = extract_tool_id_and_name(self.slots[index].name)
            if tool_name:
                self.slots[index].id = tool_id or ""
                self.slots[index].name = tool_name
        if index >= len(self.slots):
            return
        slot = self.slots[index]
        if not slot.name_sent:
            name = slot.name or slot.names.found or ""
            if name:
                slot.name = name
                slot.name_sent = True
                self.ensure_id(slot, name)
                calls.append([index, slot.id, name, ""])

    def ensure_id(self, slot: Slot, name: str) -> None:
        """parser_engine.py:929-937 with tool_call_id_type "kimi_k2" (renderers/chat_utils/tool_call.py:27-32)."""
        if not slot.id:
            slot.id = f"functions.{name}:{self.id_count}"
            self.id_count += 1

    # ---- streaming wrappers
    def strip_trailing_reasoning(self, delta: Delta | None) -> Delta | None:
        """parser_engine.py:533-561: trailing reasoning whitespace waits until more reasoning shows it was inside."""
        if delta is not None and delta.reasoning is not None:
            if not delta.reasoning.strip():
                self.deferred_reasoning.append(delta.reasoning)
                delta.reasoning = None
            else:
                trimmed = delta.reasoning.rstrip()
                tail = delta.reasoning[len(trimmed) :]
                delta.reasoning = "".join(self.deferred_reasoning) + trimmed
                self.deferred_reasoning = [tail] if tail else []
            if delta.reasoning is None and delta.content is None and not delta.calls:
                return None
        elif self.deferred_reasoning and self.reasoning_ended:
            self.deferred_reasoning = []
        return delta

    def feed_stream(self, pieces: list[tuple[str, bool]], has_token_ids: bool) -> Delta | None:
        events = self.grammar.feed(pieces, has_token_ids)
        return self.strip_trailing_reasoning(self.events_to_delta(events))

    def finish_streaming(self) -> Delta | None:
        """parser_engine.py:251-255: the held-back tail is not passed through the reasoning strip."""
        events = self.grammar.finish()
        if events or self.deferred:
            return self.events_to_delta(events, finished=True)
        return None

    # ---- non-streaming result (_build_extracted_result, 1155-1206)
    def extracted_calls(self, log: EditLog) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for slot in self.slots:
            raw = slot.raw_args
            if not slot.name and not raw:
                continue
            name = slot.name.strip()
            if not name and raw.strip():
                name, arguments = extract_name_and_args(raw)
            elif raw.strip():
                arguments = raw.strip() or "{}"  # kimi_k2.py:237-238
                log.record(
                    "args_strip", raw, arguments, KIMI, 237, 238, f"{name}: arguments stripped of outer whitespace"
                )
            else:
                arguments = "{}"
            if not name:
                log.record(
                    "drop_call_without_name",
                    raw,
                    "",
                    ENGINE,
                    1189,
                    1197,
                    "a call whose header names no function is dropped",
                )
                continue
            if not isinstance(name, str):
                raise RequestFails(f"tool call name {name!r} is not a string (FunctionCall validation fails)")
            self.ensure_id(slot, name)
            fixed = fix_arg_types(arguments, name, self.tools)
            log.record(
                "args_schema_coerce",
                arguments,
                fixed,
                ENGINE,
                437,
                462,
                f"{name}: values coerced to the tool schema (tool_parsers/utils.py:1153-1242) and re-dumped",
            )
            calls.append(ToolCall(slot.id, name, fixed))
        return calls


def coalesce(calls: list[list]) -> list[list]:
    """parser_engine.py:1039-1067: one entry per tool index."""
    merged: dict[int, list] = {}
    for index, call_id, name, arguments in calls:
        entry = merged.get(index)
        if entry is None:
            merged[index] = [index, call_id, name, arguments]
            continue
        if call_id is not None and entry[1] is None:
            entry[1] = call_id
        if name is not None and entry[2] is None:
            entry[2] = name
        if arguments is not None:
            entry[3] = arguments if entry[3] is None else entry[3] + arguments
    return list(merged.values())


def extract_name_and_args(raw: str) -> tuple[object, str]:
    """parser_engine.py:1208-1237: a body that is itself {"name": ..., "arguments": ...}."""
    raw = raw.strip()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return "", raw
    except ValueError as error:  # e.g. an integer past int's digit limit: not caught there, the request fails
        raise RequestFails(str(error)) from error
    if not isinstance(parsed, dict):
        return "", raw
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)


# ---- schema coercion (parser_engine.py:292-345, 437-462; tool_parsers/utils.py:1080-1242)


def fix_arg_types(arguments: str, name: str, tools: list[dict]) -> str:
    """ParserEngine._fix_arg_types (437-462): re-dumped only when a value changed."""
    if not tools or not name:
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(parsed, dict):
        return arguments
    properties = (tool_schema(tools, name) or {}).get("properties", {})
    if not properties or not isinstance(properties, dict):
        return arguments
    if not coerce_dict(parsed, properties):
        return arguments
    return json.dumps(parsed, ensure_ascii=False)


class VllmKimiK2Parser(FamilyParser):
    """DelegatingParser(KimiK2ParserReasoningAdapter, KimiK2ParserToolAdapter) for one request."""

    # Set by the caller when known; the engine base class does not pass them to family parsers yet.
    chat_template_kwargs: dict | None = None

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        thinking = thinking_enabled(self.chat_template_kwargs)
        try:
            if stream:
                reasoning, content, calls = self.parse_stream(tools, chunks, thinking, log)
            else:
                reasoning, content, calls = self.parse_whole(text, tools, thinking, log)
        except (RequestFails, RecursionError) as error:
            return ParsedTurn(None, None, (), f"vllm 0.33.0 fails the request: {error}")
        return ParsedTurn(reasoning, content, tuple(calls))

    def engines(self, thinking: bool, tools: list[dict]) -> tuple[KimiEngine | None, KimiEngine | None]:
        """The reasoning adapter's engine (tool parsing off) and the tool adapter's (abstract_parser.py:126-166)."""
        reasoner = KimiEngine(thinking, tools, True, DropLog()) if self.reasoning_parser else None
        tooler = KimiEngine(thinking, tools, False, DropLog(), reasoner is None) if self.tool_parser else None
        return reasoner, tooler

    # ---- non-streaming: DelegatingParser.parse (abstract_parser.py:841-855)
    def parse_whole(
        self, text: str, tools: list[dict], thinking: bool, log: EditLog
    ) -> tuple[str | None, str | None, list[ToolCall]]:
        reasoner, tooler = self.engines(thinking, tools)
        reasoning: str | None = None
        content: str | None = text
        if reasoner is not None and thinking:  # KimiK2Parser.extract_reasoning (kimi_k2.py:256-263)
            events = reasoner.grammar.feed([(text, False)], False) + reasoner.grammar.finish()
            raw = "".join(e.value for e in events if e.kind == "reasoning")
            stripped = raw.rstrip()
            log.record("reasoning_rstrip", raw, stripped, ENGINE, 586, 587, "reasoning.rstrip()")
            reasoning = stripped or None
            content = "".join(e.value for e in events if e.kind == "text") or None
            reasoner.drops.record(log, "reasoning pass")
        if tooler is None:
            return reasoning, content, []
        # extract_tool_calls_from_content (parser_engine.py:628-651) -> _single_pass_parse (776-804)
        tooler.reset(CONTENT)
        events = tooler.grammar.feed([(content or "", False)], False) + tooler.grammar.finish()
        delta = tooler.events_to_delta(events, finished=True)
        calls = tooler.extracted_calls(log)
        tooler.drops.record(log, "tool pass")
        self.record_ws_drop(tooler, log)
        parsed = delta.content if delta else None
        if parsed and calls and not parsed.strip():
            # _strip_content_whitespace (488-498): whitespace-only content next to calls becomes empty
            log.record("drop_ws_content", parsed, "", ENGINE, 496, 497, "whitespace-only content before tool calls")
            parsed = ""
        # DelegatingParser._extract_tool_calls (391-491): content of the tool engine either way
        return reasoning, parsed or None, calls

    @staticmethod
    def record_ws_drop(engine: KimiEngine, log: EditLog) -> None:
        log.record(
            "drop_ws_content",
            "".join(engine.ws_dropped),
            "",
            ENGINE,
            904,
            906,
            "whitespace-only content before tool calls is dropped",
        )

    # ---- streaming: DelegatingParser.parse_delta (abstract_parser.py:857-1007), accumulated as the oracle does
    def parse_stream(
        self, tools: list[dict], chunks: list[str], thinking: bool, log: EditLog
    ) -> tuple[str | None, str | None, list[ToolCall]]:
        reasoner, tooler = self.engines(thinking, tools)
        # the prompt ends with <think> when thinking, so reasoning is open; otherwise it is closed (is_reasoning_end)
        reasoning_ended = reasoner is None or not thinking
        tool_text_started = False
        reasoning_out: list[str] = []
        content_out: list[str] = []
        accumulated: dict[int, dict] = {}
        chunks = keep_special_tokens_whole(chunks, SPECIAL_TOKENS)
        for position, chunk in enumerate(chunks):
            pieces = split_special_tokens(chunk)
            delta: Delta | None = None
            transitioned = False
            feed_pieces, feed_ids = pieces, True
            if reasoner is not None and not reasoning_ended:
                reasoner.initialize_streaming(None)
                delta = reasoner.feed_stream(pieces, True)
                if reasoner.reasoning_ended:
                    reasoning_ended = transitioned = True
                    delta, feed_pieces, feed_ids = self.hand_over(reasoner, tooler, delta, pieces)
            if reasoning_ended and tooler is not None:
                if tool_text_started:
                    feed_pieces, feed_ids = pieces, True
                tool_text_started = True
                from_this_batch = delta.reasoning if delta else None
                tooler.initialize_streaming(CONTENT)
                delta = tooler.feed_stream(feed_pieces, feed_ids)
                if from_this_batch:
                    if delta is None:
                        delta = Delta(reasoning=from_this_batch)
                    elif not delta.reasoning:
                        delta.reasoning = from_this_batch
            if delta is None and not transitioned and reasoning_ended and tooler is None:
                delta = Delta(content=chunk or None)
            if position == len(chunks) - 1:
                delta = self.flush_engines(delta, reasoner if not reasoning_ended else None, tooler)
            if delta is None:
                continue
            if delta.reasoning:
                reasoning_out.append(delta.reasoning)
            if delta.content:
                content_out.append(delta.content)
            for index, call_id, name, arguments in delta.calls:
                entry = accumulated.setdefault(index, {"id": None, "name": "", "arguments": []})
                if call_id and entry["id"] is None:
                    entry["id"] = call_id
                if name:
                    entry["name"] += name
                if arguments:
                    entry["arguments"].append(arguments)
        reasoning = "".join(reasoning_out)
        if reasoner is not None:
            log.record(
                "reasoning_rstrip_deferred",
                "".join(reasoner.raw_reasoning),
                reasoning,
                ENGINE,
                533,
                561,
                "trailing reasoning whitespace is held back per delta and dropped when reasoning ends",
            )
            reasoner.drops.record(log, "reasoning pass")
        if tooler is not None:
            tooler.drops.record(log, "tool pass")
            self.record_ws_drop(tooler, log)
        calls = [
            ToolCall(entry["id"], entry["name"], "".join(entry["arguments"]))
            for _, entry in sorted(accumulated.items())
        ]
        return reasoning or None, "".join(content_out) or None, calls

    @staticmethod
    def hand_over(
        reasoner: KimiEngine, tooler: KimiEngine | None, delta: Delta | None, pieces: list[tuple[str, bool]]
    ) -> tuple[Delta | None, list[tuple[str, bool]], bool]:
        """The chunk that ends reasoning (abstract_parser.py:907-936): the reasoning engine's content and its flushed
        tail become the tool engine's first input, with the token ids after the end marker."""
        after = content_after_reasoning(pieces)
        flush = reasoner.finish_streaming()
        text = ((delta.content if delta else None) or "") + ((flush.content if flush else None) or "")
        if tooler is None:
            if text:
                delta = delta or Delta()
                delta.content = text
            return delta, [], False
        if delta is not None:
            delta.content = None
        specials = tuple(piece for piece, special in after if special)
        feed = split_special_tokens(text, specials) if specials else ([(text, False)] if text else [])
        return delta, feed, bool(after)

    @staticmethod
    def flush_engines(delta: Delta | None, reasoner: KimiEngine | None, tooler: KimiEngine | None) -> Delta | None:
        """_flush_engine_parsers (1015-1051); the reasoning engine only while reasoning is still open."""
        for engine in (reasoner, tooler):
            flush = engine.finish_streaming() if engine is not None else None
            if flush is None:
                continue
            if delta is None:
                delta = flush
                continue
            if flush.content:
                delta.content = (delta.content or "") + flush.content
            if flush.reasoning:
                delta.reasoning = (delta.reasoning or "") + flush.reasoning
            delta.calls += flush.calls
        return delta


def content_after_reasoning(pieces: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """KimiK2Parser.extract_content_ids (kimi_k2.py:240-254), one id per piece as the oracle feeds them."""
    ends = [i for i, (piece, special) in enumerate(pieces) if special and piece == THINK_END]
    if ends:
        return pieces[ends[-1] + 1 :]
    sections = [i for i, (piece, special) in enumerate(pieces) if special and piece == SECTION_START]
    if sections:
        return pieces[sections[-1] :]
    return []
