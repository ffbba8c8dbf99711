"""Plain data passed between the pipeline's steps.

scenario -> model output -> parse -> next request -> render -> tokenize -> compare -> cause.
Every step takes and returns these frozen dataclasses, so each can be shown, exported and tested alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Location:
    """A place in real code that did something to the text.

    `origin` names whose code it is: "vllm 0.33.0", "sglang 0.5.23", "template qwen3.6", "encoder deepseek-v4".
    `path` is relative to that code's root (a wheel's top level, or the template file name).
    """

    origin: str
    path: str
    line: int
    end_line: int | None = None
    text: str = ""

    def __str__(self) -> str:
        span = f"{self.line}-{self.end_line}" if self.end_line and self.end_line != self.line else f"{self.line}"
        return f"{self.path}:{span}"


@dataclass(frozen=True)
class Edit:
    """One text-changing step of a parser: what it was given, what it returned, and the code that did it."""

    step: str  # short machine name, e.g. "reasoning_rstrip", "args_json_redump", "content_strip"
    before: str
    after: str
    location: Location
    description: str  # one line, for people


@dataclass(frozen=True)
class ToolCall:
    id: str | None
    name: str
    arguments: str  # the JSON (or raw) string the engine returns to the client


@dataclass(frozen=True)
class ParseResult:
    """What an engine returns to the client for one completion (OpenAI-style), plus how it got there."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    edits: tuple[Edit, ...] = ()
    # Set when the real engine fails the request instead of returning a message.
    error: str | None = None
    # Real-engine backend only: stubbed names (heavy dependencies left out) that this parse touched.
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "reasoning": self.reasoning,
            "content": self.content,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "edits": [
                {
                    "step": e.step,
                    "before": e.before,
                    "after": e.after,
                    "description": e.description,
                    "location": {
                        "origin": e.location.origin,
                        "path": e.location.path,
                        "line": e.location.line,
                        "end_line": e.location.end_line,
                    },
                }
                for e in self.edits
            ],
            "error": self.error,
            **({"warnings": list(self.warnings)} if self.warnings else {}),
        }


Provenance = tuple[tuple[int, ...], tuple[int, ...]]  # (message_index, source_line), one entry per character


class _ComputedOnFirstRead:
    """A `Rendered` provenance field that may be given as a function and computed the first time it is read.

    Most renders are only ever compared as text; recording which message and template line produced each character
    costs about twice the render itself (Jinja's recorder) to nine times (the DeepSeek encoder's line tracer), so
    renderers can hand over a function instead (dataclass fields whose default is a descriptor store and read
    through it, so the constructor and the attribute names are unchanged).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, instance: Rendered | None, owner: type) -> tuple[int, ...] | None:
        if instance is None:
            return None  # the field's default: not given, so computed from `provenance`
        value = instance.__dict__.get(self._slot)
        if value is None:
            instance._compute_provenance()
            value = instance.__dict__[self._slot]
        return value

    def __set__(self, instance: Rendered, value: tuple[int, ...] | None) -> None:
        instance.__dict__[self._slot] = value


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt with provenance for every character.

    `message_index[i]` is the index of the message character i came from (-1: template scaffolding);
    `source_line[i]` is the 1-based line of the template (or encoder source) that emitted it (0: unknown).
    A renderer either gives both, or gives `provenance`, a function returning both that runs on the first read
    of either; both are kept and the function is dropped once it has run.
    """

    text: str
    message_index: tuple[int, ...] = _ComputedOnFirstRead()  # type: ignore[assignment]
    source_line: tuple[int, ...] = _ComputedOnFirstRead()  # type: ignore[assignment]
    source_path: str = ""  # the template file name, or the encoder module's file name
    origin: str = ""  # e.g. "template qwen3.6", "encoder deepseek-v4", "openai-harmony 0.0.8"
    provenance: Callable[[], Provenance] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = self.__dict__["_message_index"] is not None and self.__dict__["_source_line"] is not None
        if not given and self.provenance is None:
            raise TypeError("Rendered needs message_index and source_line, or a provenance function")
        if given:
            object.__setattr__(self, "provenance", None)

    @property
    def provenance_computed(self) -> bool:
        """Whether message_index and source_line are known yet (reading either computes them)."""
        return self.__dict__["_message_index"] is not None and self.__dict__["_source_line"] is not None

    def _compute_provenance(self) -> None:
        compute = self.provenance
        if compute is None:  # another thread finished it between the check and here
            return
        message_index, source_line = compute()
        self.__dict__["_message_index"], self.__dict__["_source_line"] = tuple(message_index), tuple(source_line)
        object.__setattr__(self, "provenance", None)

    def __getstate__(self) -> dict:
        # Pickled or deep-copied with its provenance computed: the function is a closure over a renderer.
        self._compute_provenance()
        return dict(self.__dict__)


@dataclass(frozen=True)
class Tokens:
    """Token ids of one whole string with each token's character span in that string."""

    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    text: str = field(repr=False, default="")
