"""vLLM 0.33.0 GPT-OSS harmony: `--reasoning-parser openai_gptoss --tool-call-parser openai`.

For harmony models ParserManager always builds HarmonyParser (vllm/parser/parser_manager.py:179-185); the named
reasoning/tool classes are only capability stubs. HarmonyParser (vllm/parser/harmony.py) feeds the TOKEN ids to
openai-harmony's StreamableParser, so this emulation tokenises the text with the real GPT-OSS encoding
(openai-harmony 0.0.8, the library vLLM uses) and drives the real StreamableParser token by token; what vLLM does
around it (segment typing, argument re-serialisation, the EOS recovery, streaming assembly) is re-implemented here.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from engine.errors import AssetError
from engine.serving.base import EditLog, FamilyParser, ParsedTurn
from engine.types import ToolCall

HARMONY = "vllm/parser/harmony.py"
ASSEMBLY = "vllm/entrypoints/openai/chat_completion/message_assembly.py"
STREAM = "vllm/entrypoints/openai/chat_completion/stream_processor.py"
RANDOM_ID = "chatcmpl-tool-<uuid>"

# Only these end a message, so the parser's (whole, JSON-serialised) message list need not be read after other tokens.
STOP_TOKENS = frozenset({200002, 200007, 200012})  # <|return|>, <|end|>, <|call|>
BUILTIN_TOOLS = frozenset({"python", "browser", "container"})  # harmony_utils.py:80-84


@functools.cache
def harmony_encoding() -> Any:
    from engine.render.harmony import load_harmony_encoding

    return load_harmony_encoding()


@functools.cache
def harmony_library() -> Any:
    import openai_harmony

    return openai_harmony


def normalize_recipient(recipient: str | None) -> str | None:
    """harmony.py:406-415: a '<|constrain|>' misparsed into the recipient is cut off."""
    if recipient is None:
        return None
    cut = recipient.find("<|constrain|>")
    return recipient if cut == -1 else (recipient[:cut].rstrip() or None)


def is_function_recipient(recipient: str | None) -> bool:
    """harmony_utils.py:33-61 as the chat path calls it (no allowed-name set)."""
    if not recipient or recipient.startswith("<|"):
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    if recipient == "assistant" or recipient in BUILTIN_TOOLS:
        return False
    return recipient.split(".", 1)[0] not in BUILTIN_TOOLS


def segment_kind(channel: str | None, recipient: str | None) -> str:
    """harmony.py:66-76."""
    if is_function_recipient(recipient):
        return "tool"
    if channel == "analysis":
        return "reasoning"
    if channel == "final" or (channel == "commentary" and recipient is None):
        return "content"
    return "ignore"


@dataclass(frozen=True)
class Message:
    """A completed harmony message, as much of it as vLLM reads."""

    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str


@dataclass(frozen=True)
class Segment:
    """harmony.py:79-83: one processed token (or a flush) and what it produced."""

    channel: str | None
    recipient: str | None
    delta: str
    completed: Message | None = None


class HarmonyStream:
    """HarmonyParser's token loop (harmony.py:110-177, 331-373) around the real StreamableParser."""

    def __init__(self, encoding: Any, log: EditLog) -> None:
        self.encoding = encoding
        self.log = log
        self.rejected: list[int] = []
        self.reset()

    def reset(self) -> None:
        library = harmony_library()
        self.parser = library.StreamableParser(self.encoding, role=library.Role.ASSISTANT)
        self.message_tokens: list[int] = []  # tokens since the last completed message, for the EOS recovery

    def open_message(self) -> Message | None:
        """The message a stop token (or EOS) would complete now, from the parser's state; None outside a body.

        vLLM re-reads the parser's whole message list after every token (harmony.py:127-134); that list only grows
        when a stop token or EOS ends a body, and then by exactly this message, so reading it from the state before
        the token gives the same result without the quadratic cost on outputs with many messages.
        """
        state = self.parser.state_data
        if state.get("state") != "Content":
            return None
        header = state["header"]
        return Message(
            str(header["author"]["role"]),
            header.get("channel"),
            normalize_recipient(header.get("recipient")),
            header.get("content_type"),
            self.parser.current_content,
        )

    def closed(self, candidate: Message | None) -> Message | None:
        """`candidate` if the last token (or EOS) ended its body."""
        if candidate is None or self.parser.state_data.get("state") == "Content":
            return None
        return candidate

    def process(self, token_ids: list[int]) -> list[Segment]:
        rejected_here = harmony_library().HarmonyError
        segments = []
        for token in token_ids:
            candidate = self.open_message() if token in STOP_TOKENS else None
            try:
                self.parser.process(token)
            except rejected_here:
                self.rejected.append(token)
                continue
            completed = self.closed(candidate)
            if completed is None:
                self.message_tokens.append(token)
            else:
                self.message_tokens.clear()
            segments.append(
                Segment(
                    self.parser.current_channel,
                    normalize_recipient(self.parser.current_recipient),
                    self.parser.last_content_delta or "",
                    completed,
                )
            )
        return segments

    def flush(self) -> list[Segment]:
        """harmony.py:136-177: end of stream; an unfinished message comes back as final content, markup included."""
        if self.rejected:
            self.log.record(
                "tokens_rejected",
                self.encoding.decode(self.rejected),
                "",
                HARMONY,
                338,
                341,
                "tokens the harmony grammar rejects where they stand are skipped",
            )
            self.rejected.clear()
        segments = []
        candidate = self.open_message()
        try:
            self.parser.process_eos()
            completed = self.closed(candidate)
        except harmony_library().HarmonyError:
            text = self.encoding.decode(self.message_tokens)
            self.log.record(
                "eos_unfinished_as_content",
                "",
                text,
                HARMONY,
                141,
                159,
                "the parser ended mid-message: that message's tokens are decoded and returned as final content",
            )
            segments.append(Segment("final", None, text))
            completed = Message("assistant", "final", None, None, text)
        self.reset()
        if completed is not None:
            segments.append(Segment(completed.channel, completed.recipient, "", completed))
        return segments


class VllmGptOssParser(FamilyParser):
    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        try:
            encoding = harmony_encoding()
        except AssetError as err:
            return ParsedTurn(None, None, (), f"vllm 0.33.0 gpt-oss: {err}")
        # vLLM parses the sampled token ids; the text's own tokenisation stands in for them
        token_ids = list(encoding.encode(text, allowed_special="all"))
        harmony = HarmonyStream(encoding, log)
        keeps_calls = bool(tools) and self.tool_parser is not None  # message_assembly.py:65-101
        if stream:
            return self.parse_stream(token_ids, harmony, keeps_calls, log)
        segments = harmony.process(token_ids) + harmony.flush()
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall] = []
        call_log = EditLog(log.origin)  # logged after the content's edits: the output's order
        for segment in segments:
            message = segment.completed
            # harmony.py:204-205: only assistant messages count (a body is never missing, only empty)
            if message is None or message.role != "assistant":
                continue
            kind = segment_kind(message.channel, message.recipient)
            if kind == "reasoning" and self.reasoning_parser is not None and message.text:
                reasoning.append(message.text)
            elif kind == "content" and message.text:
                content.append(message.text)
            elif kind == "tool" and self.tool_parser is not None:
                try:
                    calls.append(self.call(message, call_log))
                except RecursionError:
                    # harmony.py:222-225 catches only JSONDecodeError: the request fails
                    return ParsedTurn(
                        None, None, (), f"vllm 0.33.0 gpt-oss: the arguments of {message.recipient} nest too deeply "
                        "for json.loads (harmony.py:223), so the request fails"
                    )
            elif kind == "ignore" and message.text:
                log.record(
                    "message_ignored",
                    message.text,
                    "",
                    HARMONY,
                    66,
                    76,
                    f"channel {message.channel!r} to {message.recipient!r} is neither reasoning, content nor a call",
                )
        turn = ParsedTurn(self.join(reasoning, log, 233), self.join(content, log, 234), tuple(calls))
        if calls and not keeps_calls:
            self.drop_calls(calls, log, ASSEMBLY, 56, 59)
            return ParsedTurn(turn.reasoning, turn.content, ())
        log.edits.extend(call_log.edits)
        return turn

    @staticmethod
    def call(message: Message, log: EditLog) -> ToolCall:
        """harmony.py:215-231: JSON arguments are re-dumped with json.dumps' defaults."""
        text = message.text
        name = (message.recipient or "").removeprefix("functions.")
        if message.content_type is not None and "json" not in message.content_type:
            return ToolCall(RANDOM_ID, name, text)
        try:
            arguments = json.dumps(json.loads(text))
        except ValueError:  # json.JSONDecodeError: the text is kept as it is
            return ToolCall(RANDOM_ID, name, text)
        log.record(
            "args_json_redump",
            text,
            arguments,
            HARMONY,
            219,
            225,
            f"{name}: json.dumps(json.loads(...)): ', ' and ': ' separators, non-ASCII escaped as \\uXXXX",
        )
        return ToolCall(RANDOM_ID, name, arguments)

    @staticmethod
    def join(parts: list[str], log: EditLog, line: int) -> str | None:
        joined = "\n".join(parts)
        log.record(
            "messages_joined",
            "".join(parts),
            joined,
            HARMONY,
            line,
            line,
            "several messages of one kind are joined with '\\n'",
        )
        return joined or None

    @staticmethod
    def drop_calls(calls: list[ToolCall], log: EditLog, path: str, line: int, end_line: int) -> None:
        for call in calls:
            log.record(
                "calls_dropped",
                call.arguments or call.name,
                "",
                path,
                line,
                end_line,
                f"{call.name}: the request declares no tools (or no tool parser), so calls are not returned",
            )

    def parse_stream(self, token_ids: list[int], harmony: HarmonyStream, keeps_calls: bool, log: EditLog) -> ParsedTurn:
        """harmony.py:237-329 once per token, the way the engine streams them; deltas accumulated by the client."""
        reasoning: list[str] = []
        content: list[str] = []
        calls: dict[int, tuple[str, list[str]]] = {}  # index -> (name, argument deltas)
        next_index = 0
        steps = [token_ids[i : i + 1] for i in range(len(token_ids))] or [[]]
        for position, step in enumerate(steps):
            previous = normalize_recipient(harmony.parser.current_recipient)
            segments = harmony.process(step)
            if position == len(steps) - 1:
                segments += harmony.flush()
            for segment in segments:
                if segment.completed is not None:
                    previous = None
                    continue
                kind = segment_kind(segment.channel, segment.recipient)
                if kind == "reasoning" and self.reasoning_parser is not None:
                    reasoning.append(segment.delta)
                elif kind == "content":
                    content.append(segment.delta)
                elif kind == "tool" and self.tool_parser is not None:
                    if previous != segment.recipient:
                        # a new recipient opens a new call (harmony.py:273-289)
                        name = (segment.recipient or "").removeprefix("functions.")
                        calls[next_index] = (name, [segment.delta])
                        next_index += 1
                        previous = segment.recipient
                    elif segment.delta:
                        calls.setdefault(next_index - 1, ("", []))[1].append(segment.delta)
        streamed = [ToolCall(RANDOM_ID, name, "".join(deltas)) for _, (name, deltas) in sorted(calls.items())]
        if streamed and not keeps_calls:
            self.drop_calls(streamed, log, STREAM, 85, 90)
            streamed = []
        return ParsedTurn("".join(reasoning) or None, "".join(content) or None, tuple(streamed))
