"""The engine base: one serving engine at one release (EngineEmulation, which the emulations and the real backend
both are), the family parser it drives, the edits a parse records, and the next request as the engine prepares it."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from engine.serving.spec import EngineSpec
from engine.types import Edit, Location, ParseResult, ToolCall


@dataclass(frozen=True)
class RequestPrep:
    """The next request's messages as the engine hands them to the template, with the edits it made."""

    messages: list[dict]
    edits: tuple[Edit, ...]
    error: str | None
    # The template kwargs the engine hands the renderer, when its own code resolved them (the real backend: vLLM
    # keeps only those the template reads); None: the request's, unchanged.
    template_kwargs: dict | None = None
    # The request's tools as the engine hands them to the template (SGLang renders its pydantic models' dumps);
    # None: as the client sent them.
    tools: list[dict] | None = None


@dataclass
class EditLog:
    """Collects the text-changing steps of one parse; a step that changed nothing is not recorded."""

    origin: str
    edits: list[Edit] = field(default_factory=list)

    def record(
        self, step: str, before: str, after: str, path: str, line: int, end_line: int | None, description: str
    ) -> None:
        if before != after:
            self.edits.append(Edit(step, before, after, Location(self.origin, path, line, end_line), description))


@dataclass(frozen=True)
class ParsedTurn:
    reasoning: str | None
    content: str | None
    calls: tuple[ToolCall, ...]
    error: str | None = None


class FamilyParser(ABC):
    """One model family's reasoning + tool-call parsing as one engine version does it.

    Built per request from the engine's CLI names, since one family class serves several names (e.g. SGLang's
    `qwen3_coder` and the wrong `qwen` JSON detector).
    """

    def __init__(self, reasoning_parser: str | None, tool_parser: str | None) -> None:
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        # Request context some engines read: the request's chat_template_kwargs (e.g. Kimi's `thinking`) and how
        # many tool calls the history already holds (SGLang numbers Kimi ids after them).
        self.chat_template_kwargs: dict = {}
        self.history_tool_calls = 0

    @abstractmethod
    def parse(self, text: str, tools: list[dict], stream: bool, chunks: list[str], log: EditLog) -> ParsedTurn:
        """Return what the client receives; `chunks` is only read when `stream` is true."""


def default_chunks(text: str, width: int = 4) -> list[str]:
    """Streaming chunks when the caller gives none: pieces of `width` characters (at least one, possibly empty)."""
    return [text[i : i + width] for i in range(0, len(text), width)] or [""]


class EngineEmulation(ABC):
    """One serving engine at one version: its parsers by CLI name, its response parsing and its request side."""

    name: str
    version: str
    reasoning_parsers: dict[str, str]  # CLI name -> family
    tool_parsers: dict[str, str]
    families: dict[str, type[FamilyParser]]  # family -> its parser module's class
    # A parser pair chosen by the user ("vllm@0.31.0/qwen3+hermes") instead of the model's own; None: the model's.
    parser_override: dict[str, str | None] | None = None
    # True for the real-engine backend (a release's own code): callers hand it the model's tokenizer, whose added
    # tokens reach the release's parsers, and the options only it reads (force_reasoning, trace).
    is_real_release = False
    # Server flags the column starts the server with (`sglang@0.5.23[strip-thinking-cache]`), by their CLI names to
    # their values; only the real backend runs them (engine.serving.registry.get_engine sets them on an instance).
    server_flags: dict[str, Any] = {}
    # The package the cell's request_side names; None: this class's module. The pinned emulations set the path they
    # had before they moved to engine/serving/emulated, so the matrix JSON's text stays as it was (issue 25).
    request_side_package: str | None = None

    @property
    def origin(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def release_spec(self) -> EngineSpec:
        """This engine's release as a column names it (vllm@0.33.0), without the parser pair."""
        return EngineSpec(self.name, self.version)  # type: ignore[arg-type]  # name: vllm | sglang

    def family_parser(self, reasoning_parser: str | None, tool_parser: str | None) -> FamilyParser:
        """The family parser that handles this pair of CLI names (the tool parser's family wins)."""
        family = self.tool_parsers.get(tool_parser or "") or self.reasoning_parsers[reasoning_parser or ""]
        return self.families[family](reasoning_parser, tool_parser)

    def check_names(self, reasoning_parser: str | None, tool_parser: str | None) -> None:
        if reasoning_parser is not None and reasoning_parser not in self.reasoning_parsers:
            raise ValueError(
                f"{self.spec}: unknown reasoning parser {reasoning_parser!r}; known: "
                f"{', '.join(sorted(self.reasoning_parsers))}"
            )
        if tool_parser is not None and tool_parser not in self.tool_parsers:
            raise ValueError(
                f"{self.spec}: unknown tool parser {tool_parser!r}; known: {', '.join(sorted(self.tool_parsers))}"
            )

    def asks_release(self, reasoning_parser: str | None, tool_parser: str | None) -> bool:
        """Whether serving this pair asks the release's own code in its worker (the real backend always does; an
        emulation where it hands the pair to that code). What the matrix starts workers ahead for
        (engine.serving.registry.spawn_releases): a worker an emulation asks that this does not name starts at its
        first ask."""
        return self.is_real_release

    def emulates(self, reasoning_parser: str | None, tool_parser: str | None) -> bool:
        """Whether this emulation covers the pair: both are its own names and a tool parser comes with a reasoning
        parser (the golden corpus checks the emulations only so; a model served without --reasoning-parser, such as
        Qwen3-Coder, runs the release's real code instead: engine.serving.registry.for_parsers)."""
        try:
            self.check_names(reasoning_parser, tool_parser)
        except ValueError:
            return False
        return reasoning_parser is not None or tool_parser is None

    def parse(
        self,
        text: str,
        *,
        reasoning_parser: str | None,
        tool_parser: str | None,
        tools: list[dict] | None = None,
        stream: bool = False,
        chunks: list[str] | None = None,
        chat_template_kwargs: dict | None = None,
        history_tool_calls: int = 0,
        tokenizer: Any = None,
    ) -> ParseResult:
        """`tokenizer`: the model's real tokenizer, which the real-engine backend hands to the release's parsers (the
        emulations know their tokens and ignore it)."""
        self.check_names(reasoning_parser, tool_parser)
        log = EditLog(self.origin)
        if reasoning_parser is None and tool_parser is None:
            return self.serve(ParseResult(reasoning=None, content=text), tools=list(tools or []), stream=stream)
        parser = self.family_parser(reasoning_parser, tool_parser)
        parser.chat_template_kwargs = dict(chat_template_kwargs or {})
        parser.history_tool_calls = history_tool_calls
        turn = parser.parse(
            text, list(tools or []), stream, chunks if chunks is not None else default_chunks(text), log
        )
        result = ParseResult(turn.reasoning, turn.content, turn.calls, tuple(log.edits), turn.error)
        return result if result.error else self.serve(result, tools=list(tools or []), stream=stream)

    def serve(self, result: ParseResult, *, tools: list[dict], stream: bool) -> ParseResult:
        """What the engine's serving layer does to the parsed message before the client gets it (default: nothing);
        an engine version overrides it, the family parsers never see it."""
        return result

    def output_text(self, text: str, stop_token: str | None, tool_parser: str | None) -> str:
        """What the parsers receive of a completion that ended with `stop_token`: engines drop the matched stop token
        from the returned text unless they keep it for a parser."""
        return text[: len(text) - len(stop_token)] if stop_token and text.endswith(stop_token) else text

    @abstractmethod
    def prepare_request(self, messages: list[dict], tools: list[dict] | None) -> RequestPrep:
        """Rewrite the next request's messages the way this engine does before its template sees them."""

    def prepare_templated_request(self, messages: list[dict], tools: list[dict] | None, *, kwargs: dict,
                                  chat_template: str, parsers: dict[str, str] | None = None) -> RequestPrep:
        """The request side of a model rendered from a Jinja template (`chat_template`, with `kwargs`, served with
        the parser pair `parsers`): the emulations read none of them (prepare_request); the real backend runs the
        release's own code."""
        return self.prepare_request(messages, tools)

    @property
    def request_side_origin(self) -> str:
        """Which code prepared the messages, for the cell: the emulation's package."""
        package = self.request_side_package or type(self).__module__.replace('.', '/')
        return f"{self.name} {self.version} emulation ({package})"

    @staticmethod
    def _copy(messages: list[dict]) -> list[dict]:
        return json_copy(messages)


def json_copy(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), as the engine gets a request: decoded from JSON, so
    nothing in it is shared. Three times faster than copy.deepcopy on messages; anything else goes to deepcopy."""
    kind = type(value)
    if kind is dict:
        return {key: json_copy(item) for key, item in value.items()}
    if kind is list:
        return [json_copy(item) for item in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)
