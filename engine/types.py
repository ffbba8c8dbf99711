"""Plain data passed between the pipeline's steps.

scenario -> model output -> parse -> next request -> render -> tokenize -> compare -> cause.
Every step takes and returns these frozen dataclasses, so each can be shown, exported and tested alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from engine.serving.spec import EngineSpec


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
    # Real-engine backend only: the release's executed line that decided a field no edit made ("reasoning",
    # "arguments of NAME"; backend.field_sources), from its line tracer; blame names it where the field is not the
    # model's.
    sources: tuple[tuple[str, Location], ...] = ()

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


class _JoinedOnFirstRead:
    """`Rendered.text`: given as a str, or as the pieces a render made it of (engine.prefix.JoinedText), joined the
    first time it is read. A session reads a render's text only from where it differs from the one before
    (`Rendered.text_source`), so a long history is never joined twice a request."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, instance: Rendered | None, owner: type) -> str | None:
        if instance is None:
            return None  # no default: __post_init__ refuses a Rendered without a text
        value = instance.__dict__[self._slot]
        return value if isinstance(value, str) else str(value)  # a JoinedText keeps what it joined

    def __set__(self, instance: Rendered, value: Any) -> None:
        instance.__dict__[self._slot] = value


@dataclass(frozen=True)
class Rendered:
    """A rendered prompt with provenance for every character.

    `message_index[i]` is the index of the message character i came from (-1: template scaffolding);
    `source_line[i]` is the 1-based line of the template (or encoder source) that emitted it (0: unknown).
    A renderer either gives both, or gives `provenance`, a function returning both that runs on the first read
    of either; both are kept and the function is dropped once it has run.
    """

    text: str = _JoinedOnFirstRead()  # type: ignore[assignment]
    message_index: tuple[int, ...] = _ComputedOnFirstRead()  # type: ignore[assignment]
    source_line: tuple[int, ...] = _ComputedOnFirstRead()  # type: ignore[assignment]
    source_path: str = ""  # the template file name, or the encoder module's file name
    origin: str = ""  # e.g. "template qwen3.6", "encoder deepseek-v4", "openai-harmony 0.0.8"
    provenance: Callable[[], Provenance] | None = field(default=None, repr=False, compare=False)
    # (an earlier render's text, as its `text_source`, n): this text's first n characters are that one's, known from
    # how both were rendered, so a comparison of the two can start at n (engine.render.incremental). Not pickled.
    known_prefix: tuple[Any, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.__dict__["_text"] is None:
            raise TypeError("Rendered needs a text")
        given = self.__dict__["_message_index"] is not None and self.__dict__["_source_line"] is not None
        if not given and self.provenance is None:
            raise TypeError("Rendered needs message_index and source_line, or a provenance function")
        if given:
            object.__setattr__(self, "provenance", None)

    @property
    def text_source(self) -> Any:
        """The text as given: a str, or a JoinedText (its length and tails read without joining it)."""
        return self.__dict__["_text"]

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
        return {**self.__dict__, "_text": self.text, "known_prefix": None}


@dataclass(frozen=True)
class Tokens:
    """Token ids of one whole string with each token's character span in that string."""

    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    text: str = field(repr=False, default="")


@dataclass(frozen=True)
class Completion:
    text: str  # everything the model emitted, stop token included when it stopped
    stop_token: str | None  # None when truncated by max_tokens
    truncated: bool

    @property
    def parser_text(self) -> str:
        """What the engine's parsers see: the engine drops the stop token from the returned text."""
        return self.text[: len(self.text) - len(self.stop_token)] if self.stop_token else self.text


@dataclass(frozen=True)
class PrefixCheck:
    prev_len: int
    common: int

    @property
    def holds(self) -> bool:
        return self.common == self.prev_len

    def to_json(self) -> dict:
        return {"prev_len": self.prev_len, "common": self.common, "holds": self.holds}


@dataclass(frozen=True)
class Boundary:
    index: int  # 1-based request boundary
    trigger: str  # what the client appended: "tool" or "user"
    prev_prompt: Rendered
    completion: Completion
    completion_ids: tuple[int, ...] | None
    prev_prompt_ids: tuple[int, ...] | None
    parse: ParseResult
    request_edits: tuple[Edit, ...]
    next_prompt: Rendered
    next_ids: tuple[int, ...] | None
    string_prefix: PrefixCheck
    token_prefix: PrefixCheck | None
    next_request: RenderRequest | None = field(default=None, compare=False, repr=False)
    # What the column's proxies changed for this boundary (engine.serving.layers): the history the client sent, on its
    # way to the engine, and the reply, on its way back.
    layer_edits: tuple[Edit, ...] = field(default=(), compare=False, repr=False)

    @property
    def prev_text(self) -> str:
        return self.prev_prompt.text + self.completion.text

    @property
    def prev_ids(self) -> tuple[int, ...] | None:
        if self.prev_prompt_ids is None or self.completion_ids is None:
            return None
        return self.prev_prompt_ids + self.completion_ids

    @property
    def holds(self) -> bool:
        return self.string_prefix.holds and (self.token_prefix is None or self.token_prefix.holds)

    @property
    def reused_tokens(self) -> int | None:
        return self.token_prefix.common if self.token_prefix else None

    @property
    def prefill_tokens(self) -> int | None:
        return len(self.next_ids) - self.token_prefix.common if self.token_prefix and self.next_ids else None


# The closed set of cause kinds, each with the sentence a cell shows for it.
CAUSE_KINDS: dict[str, str] = {
    "reasoning-dropped": "the model's reasoning is missing from the next prompt",
    "reasoning-trimmed": "whitespace around the model's reasoning was removed or added",
    "content-dropped": "text the model wrote as content is missing from the next prompt",
    "text-rewritten": "the model's text was rewritten (a filter or method changed its characters)",
    "whitespace-normalised": "whitespace the model wrote was removed, added or replaced",
    "close-inserted": "a close the model did not write (</think>, an end-of-turn after max_tokens) is inserted",
    "scaffold-changed": "the template's own markup (headers, tags, newlines) differs from what the model emitted",
    "generation-prompt-differs": "the history renders the opening of the model's turn otherwise than the generation "
                                 "prompt the model answered",
    "args-reserialised": "the tool-call arguments were written again (spacing, key order, escapes, type markers)",
    "args-type-coerced": "a tool-call argument changed type (e.g. the model wrote 1.0, the parser returned 1)",
    "args-dropped": "the tool-call arguments were replaced (e.g. by {})",
    "call-id-renumbered": "the tool-call id in the next prompt is not the one the model wrote",
    "call-lost": "a tool call the model wrote is missing from the next prompt",
    "content-null": "an empty answer came back as null (or the reverse) and renders differently",
    "retokenised": "the text is the same, but re-tokenizing it does not give back the model's own token ids",
    "client-dropped-field": "the client sent the assistant turn back without a field the engine returned",
    "runtime-differs": "the template runtime renders a construct otherwise than transformers' Jinja (tojson, printed "
                       "values, tests, string methods, whitespace control)",
    "proxy-rewrote": "a proxy or client between the client and the engine rewrote the history (a field dropped, "
                     "renamed or changed)",
    "cache-dropped": "the engine's prefix cache keeps only the prompt: the completion's tokens are computed again",
}


@dataclass(frozen=True)
class Fix:
    """A change a user can make, proved by re-running the cell with it (`proof`)."""

    kind: str  # kwarg | engine | client | bridge
    text: str
    kwarg: str | None = None
    value: Any = None
    engine: str | None = None
    setting: str | None = None
    proof: str = ""
    changes_behaviour: bool = False  # e.g. turning reasoning off: offered only when nothing else fixes the cell

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "kwarg":
            out.update(kwarg=self.kwarg, value=self.value)
        elif self.kind in ("engine", "bridge"):
            out.update(engine=self.engine)
        elif self.kind == "client":
            out.update(setting=self.setting, value=self.value)
        out.update(text=self.text, proof=self.proof, changes_behaviour=self.changes_behaviour)
        return out


@dataclass(frozen=True)
class Contrast:
    """One template construct rendered alone under transformers' Jinja and under another runtime, with the same
    inputs: the proof that the runtimes disagree on it (a runtime cause's card shows both outputs)."""

    construct: str  # the construct's source, as rendered alone: "{{ (tool_call.arguments)|tojson }}"
    inputs: str  # its variables, as JSON
    reference: str  # "transformers' Jinja (jinja2 3.1.6)"
    reference_output: str
    runtime: str  # "MiniJinja 3.1.0"
    runtime_output: str

    def to_json(self) -> dict:
        return {"construct": self.construct, "inputs": self.inputs, "reference": self.reference,
                "reference_output": self.reference_output, "runtime": self.runtime,
                "runtime_output": self.runtime_output}


@dataclass(frozen=True)
class Cause:
    """Why a boundary breaks: the change to the model's text whose undo keeps the prefix (or moves the break furthest).

    `locations[0]` is the construct that changed the text (a filter, a condition, a parser step); the place that
    emitted the differing character follows when it is elsewhere. `proof` says what the re-run with the change undone
    gave; `changed` says in one sentence what the model wrote against what the next prompt has.
    """

    stage: str  # parser | template | tokenizer | client | runtime | proxy | cache
    kind: str  # a key of CAUSE_KINDS
    locations: tuple[Location, ...]
    changed: str
    fix: Fix | None
    proof: str = ""
    detail: str = ""
    # The parser or request-side step blamed, for the cause card's before/after (stage "parser" and "proxy").
    edit: Edit | None = None
    # A runtime cause (stage "runtime"): the construct rendered alone under both runtimes.
    contrast: Contrast | None = None

    @property
    def location(self) -> Location:
        """The construct that changed the text first; `str()` of it is the "path:line" label the JSON carries."""
        return self.locations[0]

    @property
    def origin(self) -> str:
        return self.locations[0].origin

    @property
    def line_text(self) -> str:
        return self.locations[0].text

    @property
    def explanation(self) -> str:
        return CAUSE_KINDS.get(self.kind, "")

    def to_json(self) -> dict:
        return {"stage": self.stage, "kind": self.kind, "location": str(self.location), "origin": self.origin,
                "detail": self.detail, "fix": self.fix.to_json() if self.fix else None,
                "locations": [{"origin": loc.origin, "path": loc.path, "line": loc.line, "end_line": loc.end_line,
                               "text": loc.text} for loc in self.locations],
                "changed": self.changed, "proof": self.proof, "explanation": self.explanation,
                **({"runtime_outputs": self.contrast.to_json()} if self.contrast else {})}


class Status(StrEnum):
    HOLDS = "holds"
    BREAKS = "breaks"
    ERROR = "error"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class RenderRequest:
    """What a renderer was given for one prompt, kept so that blame can render it again with one construct undone."""

    messages: list[dict]
    tools: list[dict] | None
    add_generation_prompt: bool
    kwargs: dict
    # The client's messages before the engine's request side rewrote them into `messages` (proof tests hand the
    # same request to the engine's own code).
    sent: list[dict] | None = field(default=None, compare=False)


# Counterfactuals: one change to a cell, undone. Blame asks a re-run function (given by the simulator) for the
# boundary with the change applied.
@dataclass(frozen=True)
class UseParse:
    """The breaking turn's engine result replaced (one parser edit undone, or one field as the model wrote it)."""

    parse: ParseResult


@dataclass(frozen=True)
class UndoRequestEdit:
    edit: Edit


@dataclass(frozen=True)
class UndoTemplate:
    """Template constructs undone while the template renders message `message` of the next prompt, or a later one."""

    message: int
    constructs: frozenset[int] = frozenset()
    # (construct id, a result it gave, the model's own text to give instead)
    substitute: tuple[tuple[int, str, str], ...] = ()
    # The boundary whose next request is rendered (default: the breaking one), e.g. a re-run with the engine's result
    # replaced by the model's fields as written.
    base: Boundary | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EchoingClient:
    """The client sends back everything the engine returned."""


@dataclass(frozen=True)
class WithKwargs:
    kwargs: dict


@dataclass(frozen=True)
class WithEngine:
    engine: EngineSpec


Change = UseParse | UndoRequestEdit | UndoTemplate | EchoingClient | WithKwargs | WithEngine


@dataclass(frozen=True)
class CellResult:
    model: str
    scenario: str
    engine: str
    engine_version: str
    kwargs: dict[str, Any]
    status: Status
    boundaries: tuple[Boundary, ...] = ()
    cause: Cause | None = None
    note: str | None = None  # why a cell is error/unavailable, or why token level is missing
    asset_hashes: dict[str, str] = field(default_factory=dict)
    # Which renderer built the prompts and which code prepared the messages (engine.serving.rendering.ServingPath).
    renderer: str = ""
    request_side: str = ""
    # A column with layers (a template runtime, proxies, server flags: issue 27): its canonical name and what the
    # cell passed, client side first; empty for every other column.
    column: str = ""
    layers: tuple[str, ...] = ()

    @property
    def focus(self) -> Boundary | None:
        """The boundary whose figures the cell shows: the first that breaks, else the last."""
        for b in self.boundaries:
            if not b.holds:
                return b
        return self.boundaries[-1] if self.boundaries else None
