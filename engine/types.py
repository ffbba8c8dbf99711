"""Plain data passed between the pipeline's steps.

scenario -> model output -> parse -> next request -> render -> tokenize -> compare -> cause.
Every step takes and returns these frozen dataclasses, so each can be shown, exported and tested alone.
"""

from __future__ import annotations

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
        }


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt with provenance for every character.

    `message_index[i]` is the index of the message character i came from (-1: template scaffolding);
    `source_line[i]` is the 1-based line of the template (or encoder source) that emitted it (0: unknown).
    """

    text: str
    message_index: tuple[int, ...]
    source_line: tuple[int, ...]
    source_path: str  # the template file name, or the encoder module's file name
    origin: str  # e.g. "template qwen3.6", "encoder deepseek-v4", "openai-harmony 0.0.8"


@dataclass(frozen=True)
class Tokens:
    """Token ids of one whole string with each token's character span in that string."""

    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    text: str = field(repr=False, default="")
