"""One request through our model of production: the client's messages through the engine's request side and the
model's real template and tokenizer; a completion text through the engine's parsers back into the message a client
sends. The replay of a trace step and the sample generator both go this way (the same calls engine.simulate makes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.call_ids import random_shape
from engine.client import client_message, undo_request_edit
from engine.errors import ExplorerError, RenderError
from engine.formats import AssistantTurn, Completion, get_format
from engine.formats.base import tool_call_specs
from engine.models import LoadedModel
from engine.serving.base import EngineEmulation
from engine.serving.raw import raw_request
from engine.serving.rendering import ServingUnavailable, served_model
from engine.serving.spec import EngineSpec
from engine.simulate import engine_request, template_kwargs_of
from engine.types import Edit, ParseResult, Rendered, RenderRequest


@dataclass(frozen=True)
class Served:
    """What one engine does: `engine` (raw: the format's lossless split; else the release that served), `spec` as
    users write it."""

    engine: EngineSpec
    emulation: EngineEmulation | None  # None for raw

    @property
    def spec(self) -> str:
        return str(self.engine)

    @property
    def origin(self) -> str:
        return self.emulation.origin if self.emulation is not None else "the raw split"


def replay_engine(engine: EngineSpec | str) -> EngineSpec:
    """The engine a trace is replayed through, parsed once where it comes in (a trace's command line or page)."""
    try:
        return EngineSpec.of(engine)
    except ValueError:
        raise _unknown_replay_engine(engine) from None


def served_by(engine: EngineSpec | str) -> Served:
    """What replays through `engine`: raw (the format's lossless split) or a vLLM / SGLang release."""
    from engine.serving.registry import get_engine

    spec = replay_engine(engine)
    if spec.kind == "raw":
        return Served(spec, None)
    try:
        emulation = get_engine(spec)
    except ValueError:
        raise _unknown_replay_engine(engine) from None
    return Served(emulation.release_spec, emulation)


def _unknown_replay_engine(engine: EngineSpec | str) -> ExplorerError:
    from engine.serving.registry import list_engines

    return ExplorerError(f"unknown engine {str(engine)!r}; known: raw, {', '.join(list_engines())}")


def template_kwargs(model: LoadedModel, request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    return {**model.spec.default_kwargs(), **(request_kwargs or {})}


def render_request(model: LoadedModel, served: Served, messages: list[dict], tools: list[dict] | None,
                   kwargs: dict[str, Any], *, undo: Edit | None = None
                   ) -> tuple[Rendered, tuple[Edit, ...], RenderRequest]:
    """The prompt the server renders for these client messages, its request-side edits (`undo`: one of them undone,
    for blame's counterfactuals) and what the template was given."""
    edits: tuple[Edit, ...] = ()
    if served.emulation is None:
        to_render = raw_request(messages, get_format(model.spec.family).arguments_in_history)
    else:
        try:  # the model as this engine release renders it (its own renderer where it has one)
            model = served_model(model, served.emulation)
        except ServingUnavailable as err:
            raise ExplorerError(str(err)) from None
        prep = engine_request(served.emulation, model, messages, tools, kwargs,
                              model.spec.engine_parsers.get(served.emulation.name, {}))
        if prep.error:
            raise ExplorerError(f"{served.origin} rejects the request: {prep.error}")
        to_render, edits = prep.messages, prep.edits
        tools, kwargs = prep.tools if prep.tools is not None else tools, template_kwargs_of(prep, kwargs)
        if undo is not None:
            to_render, edits = undo_request_edit(to_render, messages, undo), tuple(e for e in edits if e != undo)
    try:
        rendered = model.renderer.render(to_render, tools, add_generation_prompt=True, kwargs=kwargs)
    except RenderError as err:
        raise ExplorerError(f"model {model.id}: the request cannot be rendered: {err}") from None
    return rendered, edits, RenderRequest(to_render, tools, True, kwargs)


def completion_of(model: LoadedModel, text: str) -> Completion:
    """A completion as the model emitted it: stopped when it ends with the model's stop token, else truncated."""
    stop = next((s for s in model.spec.stop_tokens if s and text.endswith(s)), None)
    return Completion(text, stop, stop is None)


def parse_completion(model: LoadedModel, served: Served, completion: Completion, tools: list[dict] | None,
                     kwargs: dict[str, Any], calls_so_far: int = 0) -> ParseResult:
    """What the engine returns to the client for this completion."""
    fmt = get_format(model.spec.family)
    if served.emulation is None:
        return fmt.raw_parse(completion.parser_text)
    from engine.serving.registry import for_parsers, parse_served

    parsers = model.spec.engine_parsers.get(served.emulation.name, {})
    tool_parser = parsers.get("tool_call_parser")
    # A pair the pinned emulation does not cover is parsed by the same release's real code (engine.serving.emulated).
    engine = for_parsers(served.emulation, parsers.get("reasoning_parser"), tool_parser)
    try:
        _, parsed = parse_served(engine, engine.output_text(completion.text, completion.stop_token, tool_parser), dict(
            reasoning_parser=parsers.get("reasoning_parser"), tool_parser=tool_parser, tools=tools,
            chat_template_kwargs=kwargs, history_tool_calls=calls_so_far, tokenizer=model.tokenizer),
            {"added_tokens": model.spec.added_tokens})
    except (ValueError, NotImplementedError, ExplorerError) as err:
        raise ExplorerError(f"model {model.id}: {served.origin} cannot parse this output ({err})") from None
    if parsed.error:
        raise ExplorerError(f"model {model.id}: {served.origin} fails the completion: {parsed.error}")
    return parsed


def returned_message(parsed: ParseResult, call_ids: list[str] | None = None, calls_so_far: int = 0) -> dict:
    """The assistant message a client sends back: the engine's fields, its call ids (else the client's); where the
    engine draws a random id, the one the logged client sent back (`call_ids`), which that server drew."""
    logged = call_ids or []
    ids = [logged[i] if i < len(logged) and logged[i] and (not c.id or random_shape(c.id)) else
           c.id or f"call_{calls_so_far + i}" for i, c in enumerate(parsed.tool_calls)]
    return client_message(parsed, ids)


def turn_of(message: dict, where: str) -> AssistantTurn:
    """An assistant message (reasoning, content, tool calls) as the abstract turn the format writers take."""
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return AssistantTurn(reasoning if isinstance(reasoning, str) else None, content,
                         tool_call_specs(message.get("tool_calls"), where))
