"""Output formats: what a model emits for an abstract assistant turn, and a lossless splitter for it.

One module per output family registers an `OutputFormat`. `write` produces the exact completion text, stop token
included (unless truncated); `raw_parse` splits text exactly at the format's delimiters and keeps every byte, so a
`raw` cell isolates what the template alone does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from engine.errors import ExplorerError
from engine.types import Completion, ParseResult


@dataclass(frozen=True)
class ToolCallSpec:
    name: str
    arguments: dict[str, Any]
    call_id: str | None = None  # the model's own id where the format has one (Kimi's functions.name:N)


@dataclass(frozen=True)
class Knobs:
    """Variations real models produce, applied on top of the canonical output. None = canonical."""

    reasoning_newlines_before: int | None = None  # newlines before the reasoning text
    reasoning_newlines_after: int | None = None  # newlines between the reasoning text and the think close
    newlines_after_think: int | None = None  # newlines between the think close and the content / tool call
    close_think: bool = True  # False: a tool call without </think> before it
    args_json: str = "canonical"  # canonical | compact | spaced | sorted
    truncate_in: str | None = None  # reasoning | arguments | content: max_tokens cuts there, no stop token
    truncate_keep: float = 0.5  # share of that part kept

    def describe(self) -> str:
        changed = [f"{k}={v!r}" for k, v in self.__dict__.items() if v != Knobs.__dataclass_fields__[k].default]
        return ", ".join(changed) or "canonical"


@dataclass(frozen=True)
class AssistantTurn:
    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCallSpec, ...] = ()
    knobs: Knobs = field(default_factory=Knobs)


def dump_arguments(arguments: dict[str, Any], style: str) -> str:
    if style == "compact":
        return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    if style == "sorted":
        return json.dumps(dict(sorted(arguments.items())), ensure_ascii=False)
    if style == "ascii":
        return json.dumps(arguments)
    return json.dumps(arguments, ensure_ascii=False)  # canonical and spaced: json.dumps' own separators


def dump_value(value: Any, style: str) -> str:
    """A single argument value as XML-style formats write it: strings raw, everything else as JSON."""
    if isinstance(value, str):
        return value
    if style == "compact":
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


# Qwen writes `reasoning\n</think>\n\n`: no newline before the reasoning, one before </think>, two after.
QWEN_NEWLINES = (0, 1, 2)


def reasoning_close_content(turn: AssistantTurn, canonical: tuple[int, int, int] = (0, 0, 0)
                            ) -> tuple[str, dict[str, tuple[int, int]]]:
    """`reasoning</think>content`, with `canonical` newlines before the reasoning, before `</think>` and after it
    where the knobs leave them unset: none for GLM, Kimi and DSML; Qwen's and MiniMax's `reasoning\n</think>\n\n` is
    (0, 1, 2). Returns the text and the spans of the reasoning and the content."""
    k = turn.knobs
    before, after, after_think = canonical
    text = ""
    spans: dict[str, tuple[int, int]] = {}
    if turn.reasoning is not None:
        text += "\n" * (before if k.reasoning_newlines_before is None else k.reasoning_newlines_before)
        start = len(text)
        text += turn.reasoning
        spans["reasoning"] = (start, len(text))
        text += "\n" * (after if k.reasoning_newlines_after is None else k.reasoning_newlines_after)
        if k.close_think:
            text += "</think>" + "\n" * (after_think if k.newlines_after_think is None else k.newlines_after_think)
    start = len(text)
    text += turn.content
    spans["content"] = (start, len(text))
    return text, spans


def finish(text: str, spans: dict[str, tuple[int, int]], knobs: Knobs, stop_token: str) -> Completion:
    """The completion as the model ends it: cut inside the part the knobs name (no stop token), else stopped."""
    if knobs.truncate_in:
        if knobs.truncate_in not in spans:
            raise ValueError(f"knobs truncate_in={knobs.truncate_in!r}, but this turn has no {knobs.truncate_in} "
                             f"(it has: {', '.join(sorted(spans)) or 'nothing to cut'})")
        start, end = spans[knobs.truncate_in]
        return Completion(truncate(text, start, end, knobs.truncate_keep), None, True)
    return Completion(text + stop_token, stop_token, False)


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the prompt ends inside an open think block (`<think>` with no `</think>` after it), so that the
    completion starts as reasoning."""
    return prompt.rfind("<think>") > prompt.rfind("</think>")


def split_reasoning(text: str, tool_markers: tuple[str, ...], *, reasoning_open: bool = False
                    ) -> tuple[str | None, str, str]:
    """Split a completion at `</think>` and at the first tool-call marker: (reasoning, content, tool-call text).

    A tool call with no `</think>` before it ends the reasoning itself; the content is then empty. When the prompt
    opened the think block (`reasoning_open`) and the text has neither `</think>` nor a tool call, max_tokens cut the
    reasoning: all of it is reasoning.
    """
    reasoning: str | None = None
    rest = text
    if "</think>" in text:
        reasoning, rest = text.split("</think>", 1)
    at = next((i for i in (rest.find(m) for m in tool_markers) if i >= 0), -1)
    if at < 0:
        if reasoning is None and reasoning_open:
            return rest, "", ""
        return reasoning, rest, ""
    if reasoning is None:
        return rest[:at], "", rest[at:]
    return reasoning, rest[:at], rest[at:]


def truncate(text: str, start: int, end: int, keep: float) -> str:
    """Cut `text` inside [start, end) keeping `keep` of that span (at least one character when it has any)."""
    length = end - start
    cut = start + max(1 if length else 0, min(length - 1, int(length * keep))) if length > 1 else start + length
    return text[:cut]


class OutputFormat:
    family: ClassVar[str]
    # How the model's own template wants tool-call arguments in history: "mapping" (it iterates them) or
    # "string" (it prints a string as-is). The raw engine hands them over that way, losslessly.
    arguments_in_history: ClassVar[str] = "mapping"
    # Literal strings a chat template's source contains when it renders this format's tool calls / reasoning. The zoo
    # scan (engine/zoo.py) matches a template to the format whose markers all occur, most markers first; () never
    # matches.
    template_markers: ClassVar[tuple[str, ...]] = ()

    def write(self, turn: AssistantTurn, stop_token: str) -> Completion:
        raise NotImplementedError

    @staticmethod
    def client_call_id(index: int) -> str:
        """The id a client gives the `index`-th call when neither the model nor the engine named it (the raw split)."""
        return f"call_{index}"

    def raw_parse(self, text: str, *, reasoning_open: bool = False) -> ParseResult:
        """`reasoning_open`: the prompt ended inside an open think block (prompt_opens_reasoning)."""
        raise NotImplementedError


_REGISTRY: dict[str, OutputFormat] = {}


def register(fmt: OutputFormat) -> OutputFormat:
    _REGISTRY[fmt.family] = fmt
    return fmt


def get_format(family: str) -> OutputFormat:
    """The output format of `family`. Every family is registered: importing this module runs
    engine/formats/__init__.py first, which imports them all."""
    try:
        return _REGISTRY[family]
    except KeyError:
        raise KeyError(f"unknown output format {family!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def registered_formats() -> tuple[OutputFormat, ...]:
    """Every output format, by family name (all registered, as for get_format)."""
    return tuple(_REGISTRY[family] for family in sorted(_REGISTRY))


def tool_call_specs(calls: Any, where: str) -> tuple[ToolCallSpec, ...]:
    """The tool calls of an OpenAI-style assistant message (a session script's reply, a trace's response) as the
    format writers take them: arguments as an object or a JSON object string; anything else is refused."""
    specs = []
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments", {}) if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(arguments, dict):
            raise ExplorerError(f"{where}: every tool call needs function.name and function.arguments as an "
                                f"object or a JSON object string, got {call!r:.80}")
        specs.append(ToolCallSpec(function["name"], arguments, call.get("id")))
    return tuple(specs)


def with_knobs(turn: AssistantTurn, **changes: Any) -> AssistantTurn:
    return replace(turn, knobs=replace(turn.knobs, **changes))
