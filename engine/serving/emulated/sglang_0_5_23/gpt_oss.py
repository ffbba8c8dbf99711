"""SGLang 0.5.23 GPT-OSS harmony: `--reasoning-parser gpt-oss --tool-call-parser gpt-oss`.

SGLang reads harmony as TEXT, not token ids. Both stages own a separate text HarmonyParser
(sglang/srt/parser/harmony_parser.py): the reasoning stage (reasoning_parser.py GptOssDetector) splits off the analysis
channel and hands everything else on, tool-call blocks as their raw markup; the tool stage
(function_call/gpt_oss_detector.py) parses that text again. Streaming is emulated chunk by chunk because the result
depends on where the chunks fall (e.g. plain text passed through early is emitted a second time once a marker arrives).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.serving.emulated.base import tool_schema
from engine.types import ToolCall

HARMONY = "sglang/srt/parser/harmony_parser.py"
DETECTOR = "sglang/srt/function_call/gpt_oss_detector.py"
RANDOM_ID = "call_<uuid>"

MARKERS = {
    "<|start|>": "start",
    "<|channel|>": "channel",
    "<|message|>": "message",
    "<|constrain|>": "constrain",
    "<|end|>": "end",
    "<|call|>": "call",
    "<|return|>": "return",
}
LONGEST_MARKER = max(len(m) for m in MARKERS)
CALL_HEADER = "<|start|>assistant<|channel|>commentary"  # gpt_oss_detector.py:30, its has_tool_call test
# The tool stage's passthrough test (gpt_oss_detector.py:88-101): any of these in its buffer keeps plain text back.
PASSTHROUGH_BLOCKERS = (*MARKERS, "assistantfinal")
# The text fallback's three whole-buffer shapes (harmony_parser.py:425-436); its strategy test (520-525) is
# plain_keyword_found.
PLAIN_CHANNEL_RE = re.compile(r"(?:^|\s)(?:assistant)?\s*(analysis|commentary)", re.I)
PLAIN_BOTH_RE = re.compile(r"^\s*(?:assistant)?\s*(analysis|commentary)(.*?)\s*assistantfinal\s*(.*)\s*$", re.I | re.S)
PLAIN_FINAL_RE = re.compile(r"^\s*assistantfinal\s*(.*)\s*$", re.I | re.S)
PLAIN_OPEN_RE = re.compile(r"^\s*(?:assistant)?\s*(analysis|commentary)(.*)\s*$", re.I | re.S)
CALL_BODY_RE = re.compile(
    r"to=([a-zA-Z_][a-zA-Z0-9_.-]*)\s*<\|constrain\|>json<\|message\|>(.*?)(?:<\|call\|>|$)", re.S
)


@dataclass(frozen=True)
class Piece:
    """A span of the buffer: a structural marker (its kind) or plain text ("text")."""

    kind: str
    start: int
    end: int


@dataclass(frozen=True)
class HarmonyEvent:
    kind: str  # "normal", "reasoning" or "tool_call"
    content: str
    raw: str = ""  # a tool call's whole block, markers included


def held_suffix(text: str, words: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could still grow into one of `words` (harmony_parser.py:24-43)."""
    longest = 0
    for word in words:
        for size in range(min(len(word) - 1, len(text)), 0, -1):
            if word.startswith(text[-size:]):
                longest = max(longest, size)
                break
    return longest


def split_markers(text: str) -> list[Piece]:
    """The buffer as markers and text spans, with the quirks of iter_tokens (harmony_parser.py:46-120).

    An unknown `<|x|>` becomes text: "<|", then everything up to the next "<|". A buffer ending in a strict prefix of a
    marker keeps that prefix as one text span. After an unknown marker, a buffer ending in a known marker gets an
    extra empty text span.
    """
    pieces: list[Piece] = []
    size = len(text)
    position = 0
    saw_unknown = False
    while position < size:
        opening = text.find("<|", position)
        if opening == -1:
            break
        if opening > position:
            pieces.append(Piece("text", position, opening))
        marker = next((m for m in MARKERS if text.startswith(m, opening)), None)
        if marker is not None:
            pieces.append(Piece(MARKERS[marker], opening, opening + len(marker)))
            position = opening + len(marker)
            continue
        if size - opening < LONGEST_MARKER and any(m.startswith(text[opening:]) for m in MARKERS):
            pieces.append(Piece("text", opening, size))
            position = size
            break
        saw_unknown = True
        pieces.append(Piece("text", opening, opening + 2))
        closing = text.find("|>", opening + 2)
        if closing == -1:
            position = opening + 2
            continue
        following = text.find("<|", closing + 2)
        if following == -1:
            pieces.append(Piece("text", opening + 2, size))
            position = size
            break
        pieces.append(Piece("text", opening + 2, following))
        position = following
    if position < size:
        pieces.append(Piece("text", position, size))
    elif saw_unknown and text.endswith(tuple(MARKERS)):
        pieces.append(Piece("text", size, size))
    return pieces


def channel_name(header: str) -> str | None:
    lowered = header.strip().lower()
    return next((name for name in ("analysis", "commentary", "final") if lowered.startswith(name)), None)


def find_header(pieces: list[Piece], first: int) -> tuple[int | None, int | None]:
    """The first <|channel|> and the first <|message|> of the block starting at `first` (after an optional start)."""
    channel = None
    for index in range(first + (pieces[first].kind == "start"), len(pieces)):
        kind = pieces[index].kind
        if kind == "channel" and channel is None:
            channel = index
        elif kind == "message":
            return channel, index
    return channel, None


def header_text(text: str, pieces: list[Piece], channel: int, message: int) -> str:
    start = pieces[channel + 1].start if channel + 1 < len(pieces) else pieces[channel].end
    return text[start : pieces[message].start]


@dataclass
class Observations:
    """What a harmony parse dropped or reshaped, for the edit log (kept apart so the parser stays a pure emulation)."""

    swallowed: list[tuple[str, str]] = field(default_factory=list)  # (final body to its <|end|>, body taken)
    fillers: list[str] = field(default_factory=list)


class CanonicalHarmony:
    """The marker-based strategy (harmony_parser.py:123-416): whole blocks become events, the rest is held."""

    # Set when the whole buffer is one unfinished non-analysis block and nothing came out: the marker kinds whose
    # arrival could change that. Other text leaves the outcome as it is (see TextHarmonyParser.feed).
    waiting_for: frozenset[str] | None = None

    def parse(self, text: str, seen: Observations) -> tuple[list[HarmonyEvent], str]:
        pieces = split_markers(text)
        events: list[HarmonyEvent] = []
        self.waiting_for = None
        index = 0
        while index < len(pieces):
            piece = pieces[index]
            if piece.kind == "text":
                body = text[piece.start : piece.end]
                if index == len(pieces) - 1:
                    # the last text may be the start of a marker still arriving (150-156)
                    hold = held_suffix(body, tuple(MARKERS))
                    if body[: len(body) - hold]:
                        events.append(HarmonyEvent("normal", body[: len(body) - hold]))
                    return events, body[len(body) - hold :]
                after_call = index > 0 and pieces[index - 1].kind == "call"
                if after_call and body.strip().lower() == "commentary":
                    seen.fillers.append(body)  # 364-402: "commentary" right after <|call|> is filler
                elif body.strip() not in MARKERS:
                    events.append(HarmonyEvent("normal", body))
                index += 1
            elif piece.kind in ("start", "channel"):
                block = self.block(text, pieces, index, seen)
                if block is None:
                    events, rest = self.open_block(text, pieces, index, events)
                    if not events and rest == text:
                        self.waiting_for = self.unblocking_markers(text, pieces)
                    return events, rest
                event, index = block
                if event is not None:
                    events.append(event)
            else:
                index += 1  # a marker outside a block is dropped (187-197)
        return events, ""

    @staticmethod
    def unblocking_markers(text: str, pieces: list[Piece]) -> frozenset[str]:
        """For a buffer that is one unfinished block from its first piece: the markers that could complete it."""
        channel, message = find_header(pieces, 0)
        if message is None:
            return frozenset({"message"})  # the header is still open
        if channel is None:
            return frozenset({"end", "call", "return"})  # a tool response ends at any of these (284-296)
        if channel_name(header_text(text, pieces, channel, message)) is None:
            return frozenset()  # an unknown channel never completes (307-308)
        return frozenset({"end", "call"})  # commentary (analysis streams, final never waits)

    @staticmethod
    def open_block(
        text: str, pieces: list[Piece], first: int, events: list[HarmonyEvent]
    ) -> tuple[list[HarmonyEvent], str]:
        """An unfinished block: an analysis body streams as reasoning, the rest is held whole (172-181, 201-244)."""
        channel, message = find_header(pieces, first)
        if channel is not None and message is not None:
            if channel_name(header_text(text, pieces, channel, message)) == "analysis":
                body_start = pieces[message].end
                events.append(HarmonyEvent("reasoning", text[body_start:]))
                return events, text[pieces[first].start : body_start]
        return events, text[pieces[first].start :]

    @staticmethod
    def block(
        text: str, pieces: list[Piece], first: int, seen: Observations
    ) -> tuple[HarmonyEvent | None, int] | None:
        """One complete block as an event and the index after it, or None while it is incomplete (260-362)."""
        channel, message = find_header(pieces, first)
        if message is None:
            return None
        body_start = pieces[message].end
        if channel is None:  # no channel: a tool response, read as normal text up to any end marker (284-296)
            for index in range(message + 1, len(pieces)):
                if pieces[index].kind in ("end", "call", "return"):
                    return HarmonyEvent("normal", text[body_start : pieces[index].start]), index + 1
            return None
        name = channel_name(header_text(text, pieces, channel, message))
        if name is None:
            return None
        closers = ("return",) if name == "final" else ("end", "call")
        close = next((i for i in range(message + 1, len(pieces)) if pieces[i].kind in closers), None)
        if close is None:
            if name != "final":
                return None
            body = text[body_start:]
            CanonicalHarmony.note_swallowed(text, pieces, message, body, seen)
            return HarmonyEvent("normal", body), len(pieces)
        body = text[body_start : pieces[close].start]
        if name != "final":
            if pieces[close].kind == "call":
                return HarmonyEvent("tool_call", body.strip(), text[pieces[first].start : pieces[close].end]), close + 1
            return HarmonyEvent("reasoning" if name == "analysis" else "normal", body), close + 1
        CanonicalHarmony.note_swallowed(text, pieces, message, body, seen)
        following = close + 1
        if following < len(pieces) and pieces[following].kind == "text":
            # 353-359: text right after <|return|> joins the final answer
            return HarmonyEvent("normal", body + text[pieces[following].start : pieces[following].end]), close + 2
        return HarmonyEvent("normal", body), close + 1

    @staticmethod
    def note_swallowed(text: str, pieces: list[Piece], message: int, body: str, seen: Observations) -> None:
        """A final block ends only at <|return|> (317-319): later markup stays inside the answer."""
        stop = next((p.start for p in pieces[message + 1 :] if p.kind != "text"), None)
        if stop is not None:
            seen.swallowed.append((text[pieces[message].end : stop], body))


class PlainHarmony:
    """The fallback for harmony written without markers, "analysis...assistantfinal..." (harmony_parser.py:419-498)."""

    def parse(self, text: str, seen: Observations) -> tuple[list[HarmonyEvent], str]:
        events: list[HarmonyEvent] = []
        both = PLAIN_BOTH_RE.match(text)
        if both:
            channel, thought, answer = both.groups()
            if thought.strip():
                kind = "reasoning" if channel.lower() == "analysis" else "normal"
                events.append(HarmonyEvent(kind, thought.strip()))
            if answer.strip():
                events.append(HarmonyEvent("normal", answer.strip()))
            return events, ""
        lowered = text.lower()
        if PLAIN_CHANNEL_RE.search(text) and "assistantfin" in lowered and "assistantfinal" not in lowered:
            return events, text
        final = PLAIN_FINAL_RE.match(text)
        if final:
            if final.group(1).strip():
                events.append(HarmonyEvent("normal", final.group(1).strip()))
            return events, ""
        opened = PLAIN_OPEN_RE.match(text)
        if opened:
            channel, body = opened.groups()
            hold = held_suffix(body, ("assistantfinal",))
            emit = body[: len(body) - hold]
            kept = text[: opened.start(2)] + body[len(body) - hold :]
            if emit and channel.lower() == "analysis":
                events.append(HarmonyEvent("reasoning", emit))
                return events, kept if hold else channel
            if emit:
                events.append(HarmonyEvent("normal", emit if hold else emit.strip()))
                return events, kept if hold else ""
            return events, kept
        hold = held_suffix(text, ("analysis", "commentary", "assistantfinal"))
        if text[: len(text) - hold]:
            events.append(HarmonyEvent("normal", text[: len(text) - hold]))
        return events, text[len(text) - hold :]


KEYWORD_RE = re.compile(r"analysis|commentary|assistantfinal", re.I)
ASSISTANT_RE = re.compile(r"assistant", re.I)
LOOKBEHIND = len("assistant") + 1


def plain_keyword_found(window: str, window_start: int, new_from: int) -> bool:
    r"""The strategy regex `(?:^|\s)(?:assistant)?\s*(analysis|commentary|assistantfinal)` (re.I) searched in a buffer
    whose part before `new_from` had no match, read from its end `window`
    (starting at absolute offset `window_start`, at least LOOKBEHIND + 13 characters before `new_from`).

    The regex itself is quadratic on long whitespace runs (minutes on 100 kB of spaces); this is the same test in
    linear time: a keyword at the buffer start, after whitespace, or after "assistant" that follows start or whitespace.
    """
    for found in KEYWORD_RE.finditer(window, max(0, new_from - window_start - len("assistantfinal"))):
        at = found.start()
        if window_start + found.end() <= new_from:
            continue
        if window_start + at == 0 or (at > 0 and window[at - 1].isspace()):
            return True
        opener = at - len("assistant")
        if opener >= 0 and ASSISTANT_RE.fullmatch(window, opener, at):
            if window_start + opener == 0 or (opener > 0 and window[opener - 1].isspace()):
                return True
    return False


class TextHarmonyParser:
    """The HarmonyParser facade (harmony_parser.py:501-588): picks a strategy once, re-parses its whole buffer on
    every chunk, and drops "commentary" filler after a tool call.

    Same results as the real one; text is only gathered in `pending` (not re-parsed) while the outcome cannot change,
    so a 1 MB stream stays linear.
    """

    def __init__(self) -> None:
        self.strategy: CanonicalHarmony | PlainHarmony | None = None
        self.buffer = ""
        self.pending: list[str] = []
        self.size = 0  # len(buffer) + the pending text
        self.tail = ""  # the last characters of buffer + pending, for the strategy test
        self.filter_commentary = False
        self.partial_commentary = ""
        self.seen = Observations()

    @property
    def held(self) -> str:
        return self.buffer + "".join(self.pending)

    def gather(self, chunk: str) -> None:
        self.pending.append(chunk)
        self.size += len(chunk)
        self.tail = (self.tail + chunk)[-(LOOKBEHIND + 2 * LONGEST_MARKER) :]

    def choose_strategy(self, chunk: str) -> None:
        """Strategy test on the new text only: the buffer grows unchanged while undecided (520-528)."""
        before = self.size
        window_start = max(0, before - len(self.tail))
        window = self.tail + chunk
        self.gather(chunk)
        recent = window[max(0, before - window_start - LONGEST_MARKER) :]
        if "<|channel|>" in recent or "<|start|>" in recent:
            self.strategy = CanonicalHarmony()
        elif plain_keyword_found(window, window_start, before):
            self.strategy = PlainHarmony()

    @staticmethod
    def new_markers(window: str, old_end: int) -> set[str]:
        """Kinds of the markers in `window` that end after `old_end` (its tail reaches back past any split marker)."""
        kinds = set()
        at = window.find("<|", max(0, old_end - LONGEST_MARKER + 1))
        while at != -1:
            marker = next((m for m in MARKERS if window.startswith(m, at)), None)
            if marker is not None and at + len(marker) > old_end:
                kinds.add(MARKERS[marker])
            at = window.find("<|", at + 1)
        return kinds

    def feed(self, chunk: str) -> list[HarmonyEvent]:
        if self.strategy is None:
            self.choose_strategy(chunk)
            if self.strategy is None:
                return []  # 526-528: no strategy yet, everything is held
        elif isinstance(self.strategy, CanonicalHarmony) and self.strategy.waiting_for is not None:
            window = self.tail + chunk
            self.gather(chunk)
            if not self.new_markers(window, len(window) - len(chunk)) & self.strategy.waiting_for:
                return []  # the held block stays unfinished: re-parsing would give the same nothing
        else:
            self.gather(chunk)
        self.buffer = self.held
        self.pending = []
        events, rest = self.strategy.parse(self.buffer, self.seen)
        ends_with_call = self.buffer.rstrip().endswith("<|call|>") if events else False
        self.buffer = rest
        self.size = len(rest)
        self.tail = rest[-(LOOKBEHIND + 2 * LONGEST_MARKER) :]
        kept = []
        for event in events:
            if event.kind == "normal":
                if self.filter_commentary or self.partial_commentary:
                    candidate = self.partial_commentary + event.content.strip().lower()
                    if candidate == "commentary":
                        self.partial_commentary = ""
                        self.filter_commentary = False
                        self.seen.fillers.append(event.content)
                        continue
                    if "commentary".startswith(candidate):
                        # 559-562: a piece that could still become "commentary" (blank text too) is dropped
                        self.partial_commentary = candidate
                        self.seen.fillers.append(event.content)
                        continue
                    self.partial_commentary = ""
                    self.filter_commentary = False
                else:
                    self.partial_commentary = ""
            if event.kind == "tool_call":
                self.filter_commentary = True
                self.partial_commentary = ""
            elif ends_with_call:
                self.filter_commentary = True
            kept.append(event)
        return kept

    def record(self, log: EditLog, stage: str, content: str) -> None:
        """Log what this parser dropped or reshaped so far, then forget it; `content` is what the client got."""
        for text in self.seen.fillers:
            log.record(
                "commentary_filler_dropped",
                text,
                "",
                HARMONY,
                541,
                573,
                f"{stage}: text after a tool call that is (or may become) 'commentary' is dropped",
            )
        for delimited, taken in self.seen.swallowed:
            if taken[len(delimited) :] not in content:
                continue  # the swallowed markup was cut out again later (by the tool stage)
            log.record(
                "final_runs_to_return",
                delimited,
                taken,
                HARMONY,
                316,
                332,
                f"{stage}: the final channel ends only at <|return|> (or the end): markup after it stays in the answer",
            )
        self.seen = Observations()


class ArgumentsTooDeep(Exception):
    """json.loads hit the recursion limit: gpt_oss_detector.py:230 catches only JSONDecodeError."""


class CallExtractor:
    """gpt_oss_detector.py:197-238: name and JSON out of a call block; undeclared tools and bad JSON give nothing."""

    def __init__(self, tools: list[dict], log: EditLog) -> None:
        self.tools = tools
        self.log = log

    def extract(self, block: str) -> ToolCall | None:
        found = CALL_BODY_RE.search(block)
        if found is None:
            self.log.record(
                "call_block_unreadable", block, "", DETECTOR, 205, 209, "no 'to=NAME <|constrain|>json<|message|>'"
            )
            return None
        name, body = found.group(1).split(".")[-1], found.group(2)
        if tool_schema(self.tools, name) is None:
            self.log.record(
                "unknown_tool_dropped",
                block,
                "",
                DETECTOR,
                221,
                225,
                f"{name}: not a tool of the request, the call is dropped (SGLANG_FORWARD_UNKNOWN_TOOLS off)",
            )
            return None
        try:
            arguments = json.loads(body) if body.strip() else {}
        except RecursionError as err:
            raise ArgumentsTooDeep(name) from err
        except ValueError:
            self.log.record(
                "invalid_arguments_dropped", block, "", DETECTOR, 227, 232, f"{name}: arguments are not JSON"
            )
            return None
        dumped = json.dumps(arguments, ensure_ascii=False)
        self.log.record(
            "args_json_redump",
            body,
            dumped,
            DETECTOR,
            229,
            237,
            f"{name}: json.loads then json.dumps(ensure_ascii=False): ', ' and ': ' separators, outer space gone",
        )
        return ToolCall(RANDOM_ID, name, dumped)


class StreamingCallStage:
    """GptOssDetector.parse_streaming_increment (gpt_oss_detector.py:76-195) with its own buffer beside the harmony
    parser's: text with no marker in that buffer goes out at once although the harmony parser keeps it too."""

    def __init__(self, extractor: CallExtractor, log: EditLog) -> None:
        self.harmony = TextHarmonyParser()
        self.extractor = extractor
        self.log = log
        self.parts: list[str] = []  # the detector's own buffer (its _buffer)
        self.tail = ""
        self.has_marker = False
        self.has_call_header = False
        self.passed = ""  # plain text sent out while the harmony parser still holds it
        self.calls: list[ToolCall] = []

    def clear(self) -> None:
        self.parts, self.tail, self.has_marker, self.has_call_header = [], "", False, False

    def add(self, text: str) -> None:
        window = self.tail + text
        self.parts.append(text)
        self.tail = window[-32:]
        self.has_marker = self.has_marker or any(m in window for m in PASSTHROUGH_BLOCKERS)
        self.has_call_header = self.has_call_header or "<|channel|>commentary to=" in window

    def feed(self, text: str) -> str:
        self.add(text)
        events = self.harmony.feed(text)
        if not events and not self.has_marker:
            out = "".join(self.parts)
            self.clear()
            self.passed += out  # the harmony parser returned nothing, so it still holds this text
            return out
        if not events:
            return ""
        normal = "".join(e.content for e in events if e.kind == "normal")
        if self.passed and normal:
            self.log.record(
                "stream_text_repeated",
                self.passed,
                self.passed + normal,
                DETECTOR,
                85,
                131,
                "text without markers was streamed at once, and again when the harmony parser (which kept it) "
                "emitted it after the next marker",
            )
        self.passed = ""
        if not self.has_call_header:
            for event in events:
                if event.kind == "tool_call":
                    self.log.record(
                        "call_event_ignored",
                        event.raw,
                        "",
                        DETECTOR,
                        108,
                        135,
                        "the chunk's buffer lacks '<|channel|>commentary to=': only normal text is kept",
                    )
            self.clear()
            return normal
        for event in events:
            if event.kind == "tool_call":
                call = self.extractor.extract(event.raw or event.content)
                if call is not None:
                    self.calls.append(call)
        self.clear()
        return normal


MARKER_RE = re.compile("|".join(re.escape(m) for m in MARKERS))


def keep_markers_whole(chunks: list[str]) -> list[str]:
    """The chunks, with any boundary that falls inside a harmony marker moved to the marker's end.

    SGLang streams detokenized text and every marker is a single special token, so a real stream never splits one;
    the text parser reads a split marker as plain text (an open analysis block then swallows the rest of the output as
    reasoning), which only an artificial chunking such as base.default_chunks' 4 characters can cause.
    """
    text = "".join(chunks)
    inside = {i for found in MARKER_RE.finditer(text) for i in range(found.start() + 1, found.end())}
    if not inside:
        return chunks
    kept, current, position = [], [], 0
    for chunk in chunks:
        current.append(chunk)
        position += len(chunk)
        if position not in inside:
            kept.append("".join(current))
            current = []
    if current:
        kept.append("".join(current))
    return kept


def stage_text(events: list[HarmonyEvent]) -> tuple[str, str]:
    """The reasoning stage's split (reasoning_parser.py GptOssDetector): a call block goes on as its raw markup."""
    reasoning = "".join(e.content for e in events if e.kind == "reasoning")
    normal = "".join(e.content if e.kind == "normal" else (e.raw or e.content) for e in events if e.kind != "reasoning")
    return reasoning, normal


class SglangGptOssParser(FamilyParser):
    """The reasoning stage then the tool stage, as serving_chat.py chains them (see tests/conformance/oracle_runner.py).

    Edits are logged in output order (content before calls), so the first edit is the first place the text changed.
    """

    end_flush = "the stream-end finish() (reasoning_parser.py:336-365) flushes only the base class buffer"

    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        tools_active = bool(tools) and self.tool_parser is not None
        call_log = EditLog(log.origin)
        extractor = CallExtractor(tools, call_log)
        if stream:
            turn = self.parse_stream(chunks, tools_active, extractor, log)
        else:
            turn = self.parse_whole(text, tools_active, extractor, log)
        log.edits.extend(call_log.edits)
        return turn

    def parse_whole(self, text: str, tools_active: bool, extractor: CallExtractor, log: EditLog) -> ParsedTurn:
        reasoning, rest = None, text
        reasoner = TextHarmonyParser() if self.reasoning_parser is not None else None
        if reasoner is not None:
            reasoning, rest = stage_text(reasoner.feed(text) + reasoner.feed(""))
        caller = TextHarmonyParser()
        calls: list[ToolCall] = []
        content = rest
        # serving_chat.py (0.5.23 3178-3180, 0.5.12 1314-1320): the tool stage runs only once has_tool_call
        if tools_active and CALL_HEADER in rest:
            events = caller.feed(rest) + caller.feed("")
            try:
                found = [extractor.extract(e.raw or e.content) for e in events if e.kind == "tool_call"]
            except ArgumentsTooDeep:
                # serving_chat.py 0.5.23 3215-3217 (0.5.12 1337-1340): on an exception the text stays, no calls
                return ParsedTurn(reasoning or None, rest, ())
            calls = [call for call in found if call is not None]
            # function_call_parser.py:216-221 returns the detector's text once has_tool_call
            content = " ".join(e.content for e in events if e.kind == "normal").strip()
        if reasoner is not None:
            reasoner.record(log, "reasoning stage", content)
            self.note_dropped(log, reasoner, "reasoning stage")
        caller.record(log, "tool stage", content)
        log.record(
            "content_join_strip",
            rest,
            content,
            DETECTOR,
            58,
            73,
            "call blocks cut out, the remaining text pieces joined with ' ' and stripped",
        )
        # serving_chat.py:2997: non-streaming content is "" rather than null
        return ParsedTurn(reasoning or None, content, tuple(calls))

    def parse_stream(
        self, chunks: list[str], tools_active: bool, extractor: CallExtractor, log: EditLog
    ) -> ParsedTurn:
        reasoner = TextHarmonyParser() if self.reasoning_parser is not None else None
        caller = StreamingCallStage(extractor, log) if tools_active else None
        reasoning, pieces = [], []
        for chunk in keep_markers_whole(chunks):
            delta = chunk
            if reasoner is not None:
                thought, delta = stage_text(reasoner.feed(chunk))
                reasoning.append(thought)
            try:
                pieces.append(caller.feed(delta) if caller is not None else delta)
            except ArgumentsTooDeep as err:
                return ParsedTurn(
                    None, None, (), f"{log.origin} gpt-oss: the arguments of {err} nest too deeply for json.loads "
                    "(gpt_oss_detector.py:229): the stream fails"
                )
        content = "".join(pieces)
        if reasoner is not None:
            reasoner.record(log, "reasoning stage", content)
            self.note_dropped(log, reasoner, "reasoning stage")
        calls: list[ToolCall] = []
        if caller is not None:
            caller.harmony.record(log, "tool stage", content)
            # text the detector already streamed is not lost, although the harmony parser still holds it
            self.note_dropped(log, caller.harmony, "tool stage", already_sent=caller.passed)
            calls = caller.calls
        return ParsedTurn("".join(reasoning) or None, content or None, tuple(calls))

    def note_dropped(self, log: EditLog, harmony: TextHarmonyParser, stage: str, already_sent: str = "") -> None:
        held = harmony.held.replace(already_sent, "", 1)
        why = (
            "no harmony marker or channel word yet, so nothing was ever emitted"
            if harmony.strategy is None
            else "an unfinished block (or a possible marker start) is still held"
        )
        log.record(
            "held_text_dropped",
            held,
            "",
            HARMONY,
            514,
            539,
            f"{stage}: {why}; {self.end_flush}, never the harmony parser's",
        )
