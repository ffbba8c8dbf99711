"""The PRR roundtrip for one matrix cell: model × scenario × engine@version × template kwargs.

For every request boundary: render the prompt, write the model's completion, let the engine parse it, build the
next request as an OpenAI client would, let the engine rewrite it, render and tokenize again, and compare the
previous prompt + completion with the next prompt (string and token longest common prefix).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from engine.call_ids import SessionCallIds, random_shape
from engine.cause_store import cause_key, store_cause, stored_cause
from engine.client import client_call_ids, client_message, scripted_message, undo_request_edit
from engine.errors import ExplorerError, RenderError
from engine.formats import AssistantTurn, Completion, Knobs, get_format
from engine.formats.base import prompt_opens_reasoning
from engine.memo import BlameMemo
from engine.models import LoadedModel, load_model
from engine.prefix import common_prefix
from engine.render.cache import render_kept
from engine.scenario import Scenario, load_scenario
from engine.serving.base import EngineEmulation, RequestPrep
from engine.serving.bridge import (
    CHOICE_NOTE,
    BridgeUnavailable,
    bridge_ids,
    bridge_prompt,
    sampled_completion_ids,
)
from engine.serving.layers import LayerUnavailable
from engine.serving.raw import raw_request
from engine.serving.spec import EngineSpec
from engine.tokenize import token_ids
from engine.types import (  # noqa: F401 - Boundary, Cause, CellResult and PrefixCheck are imported from here too
    Boundary,
    Cause,
    CellResult,
    Change,
    EchoingClient,
    Edit,
    Location,
    ParseResult,
    PrefixCheck,
    Provenance,
    Rendered,
    RenderRequest,
    Status,
    UndoRequestEdit,
    UndoTemplate,
    UseParse,
    WithEngine,
    WithKwargs,
)

if TYPE_CHECKING:
    from engine.serving.layers import ColumnLayers

ENGINES = ("vllm", "sglang", "raw", "bridge", "renderers")


def _engine_parts(engine: EngineSpec) -> tuple[str, str]:
    if engine.kind in ("raw", "bridge"):
        return engine.kind, ""
    if engine.kind == "renderers":  # as asked, or renderers@<version> from evidence
        from engine import renderers_column

        return "renderers", renderers_column.version()
    emulation = _engine(engine)
    return emulation.name, emulation.version


def _parsed(engine: str) -> EngineSpec:
    from engine.serving.registry import parse_engine

    return parse_engine(engine)


def _engine(engine: EngineSpec) -> EngineEmulation:
    from engine.serving.registry import get_engine  # at call time: a test swaps the registry's get_engine

    return get_engine(engine)


def _ids(model: LoadedModel, text: str) -> tuple[int, ...] | None:
    return token_ids(model.tokenizer, text) if model.tokenizer else None


@lru_cache(maxsize=4096)
def _cached_cell(model_id: str, scenario_id: str, engine: EngineSpec | str, kwargs_json: str,
                 explain: bool) -> CellResult:
    # Only scenarios by id are cached: an in-memory scenario is somebody's data, not a name.
    return run_cell_with(load_model(model_id), scenario_id, engine, json.loads(kwargs_json), explain=explain)


def run_cell(model_id: str, scenario_id: str, engine: EngineSpec | str, kwargs: dict[str, Any] | None = None,
             *, explain: bool = True) -> CellResult:
    """One matrix cell. `kwargs` are template kwargs on top of the model's defaults and the scenario's."""
    return _cached_cell(model_id, scenario_id, engine, json.dumps(kwargs or {}, sort_keys=True), explain)


@dataclass(frozen=True)
class _Overrides:
    """One counterfactual applied to a re-run: at boundary `index`, the engine's parse replaced, or one request-side
    edit undone."""

    index: int
    parse: ParseResult | None = None
    request_undo: Edit | None = None


@dataclass(frozen=True)
class _ParseAsk:
    """One parse a run asked of its engine, as a traced run would ask it (`options["trace"]` as `trace_at` sets it):
    what _traced_break asks again, alone, for the edits of the parse at a break."""

    engine: EngineEmulation
    text: str
    request: dict[str, Any]
    options: dict[str, Any]


def run_cell_with(model: LoadedModel, scenario: Scenario | str, engine: EngineSpec | str,
                  user_kwargs: dict[str, Any], *, explain: bool = True, hints: bool = True,
                  stop_after: int | None = None, overrides: _Overrides | None = None, tokens: bool = True,
                  memo: BlameMemo | None = None) -> CellResult:
    """A cell for an already loaded model (e.g. one with a custom template) and a scenario, by id or in memory (a
    fuzzed one); not cached. `hints=False`: the cause without its fix hint (engine.blame.explain_break).
    `stop_after=N`: only boundaries 1..N are computed (cause attribution asks whether one boundary holds), and the
    status is about those. `tokens=False`: prefixes as strings only (a re-run whose question is the string prefix).
    `engine`: a spec, or its name (parsed here, once). `memo`: the engines' parses a cell whose cause is asked shares
    with its re-runs (engine.memo; such a cell makes its own)."""
    model_id = model.id
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    kwargs = {**model.spec.default_kwargs(), **scenario.kwargs, **user_kwargs}
    try:
        if isinstance(engine, str):
            engine = _parsed(engine)
        engine_name, version = _engine_parts(engine)
    except ValueError as err:
        return CellResult(model_id, scenario.id, str(engine), "", kwargs, Status.UNAVAILABLE, note=str(err))
    except ExplorerError as err:  # a release's worker that hung or died while listing the parsers a pair names
        return CellResult(model_id, scenario.id, str(engine), "", kwargs, Status.ERROR, note=str(err))
    server_defaults = engine.flag("default-chat-template-kwargs")
    if server_defaults is not None:
        # The server's defaults apply where the request leaves a kwarg unset: the model's own defaults are not sent
        # for those (a scenario's or the user's still are, and win, as in the release's code).
        kwargs = {k: v for k, v in kwargs.items() if k not in server_defaults.json_value() or k in scenario.kwargs
                  or k in user_kwargs}
    from engine.serving.layers import base_model, column_layers
    from engine.serving.rendering import ServingUnavailable, served_model, serving_path

    model = base_model(model)  # a re-run of a runtime's cell on another column renders as that column does
    emulation = _engine(engine) if engine.is_serving_engine else None
    layered = dict(column=str(engine)) if engine.has_layers else {}
    try:
        # The model as this engine release renders it (vLLM × gpt-oss through openai-harmony, …).
        model = served_model(model, emulation) if emulation is not None else (model.served_from or model)
    except ServingUnavailable as err:
        return CellResult(model_id, scenario.id, engine_name, version, kwargs, Status.UNAVAILABLE, note=str(err),
                          **layered)
    layers = None
    if engine.has_layers:
        try:
            layers = column_layers(model, engine, emulation)
        except LayerUnavailable as err:
            return CellResult(model_id, scenario.id, engine_name, version, kwargs, Status.UNAVAILABLE, note=str(err),
                              **layered)
        model = layers.model
        layered["layers"] = layers.passed
    base = dict(model=model_id, scenario=scenario.id, engine=engine_name, engine_version=version, kwargs=kwargs,
                asset_hashes=model.asset_hashes, **layered)
    if engine.kind == "renderers":
        return _renderers_cell(model, scenario, engine, kwargs, base, stop_after)

    def cell(**fields: Any) -> CellResult:  # the serving path is read after the run: which code actually ran
        return CellResult(**base, **serving_path(model, emulation, engine).to_json(), **fields)
    try:
        # The engine's parses are asked untraced: only the one at the break is traced, for its cause (below).
        if memo is None and explain:
            memo = BlameMemo()
        parse_asks: dict[int, _ParseAsk] = {}
        boundaries = _roundtrip(model, scenario, engine, kwargs, stop_after, overrides, emulation,
                                trace_parses=False, tokens=tokens, layers=layers, memo=memo, parse_asks=parse_asks)
    except _Unavailable as err:
        return cell(status=Status.UNAVAILABLE, note=str(err))
    except _Failed as err:
        return cell(status=Status.ERROR, boundaries=err.boundaries, note=str(err))
    note = model.tokenizer_unavailable
    if engine.runtime is not None and explain:  # whether the runtime's prompts are transformers' (and where not)
        from engine.runtime_compare import prompt_note

        runtime_note = prompt_note(model.renderer.inner, [(b.index + 1, b.next_prompt, b.next_request)
                                                          for b in boundaries])
        note = f"{runtime_note}; {note}" if note else runtime_note
    if engine.kind == "bridge":  # which renderer the column used, and that it rendered no history
        used = (f"append-only: the previous ids kept, the new messages rendered by {model.renderer.source_path} after "
                "a synthetic closed turn, as the client sent them")
        for b in boundaries:
            if CHOICE_NOTE in b.next_prompt.origin:
                used += f"; at request {b.index + 1} {CHOICE_NOTE}{b.next_prompt.origin.split(CHOICE_NOTE, 1)[1]}"
        note = f"{used}; {note}" if note else used
    if all(b.holds for b in boundaries):
        return cell(status=Status.HOLDS, boundaries=boundaries, note=note)
    cause = None
    if explain:
        from engine.blame import BlameContext, explain_break

        broken = next(b for b in boundaries if not b.holds)
        if engine.is_serving_engine and not broken.parse.edits and not broken.string_prefix.holds:
            # (a break in the ids alone is the tokenizer's: no parser line is cited)
            boundaries, broken = _traced_break(model, scenario, engine, kwargs, overrides, emulation, layers,
                                               boundaries, broken, memo, parse_asks.get(broken.index))
        # A cell that breaks exactly as it broke when its cause was proved takes that cause from the store (a
        # whole cell's re-run, not a part of one: overrides and stop_after leave it out)
        key = cause_key(model, scenario, engine, user_kwargs, kwargs, hints, boundaries) \
            if overrides is None and stop_after is None and tokens else None
        cause = stored_cause(key) if key is not None else None
        if cause is None:
            context = BlameContext(model, scenario, engine, user_kwargs, kwargs)
            rerun = _rerun_function(context, broken, memo)
            if engine.has_layers:  # a runtime, a proxy or a flag is blamed first, by re-running without it
                from engine.layer_blame import explain_layer_break

                def cell_without(spec: EngineSpec) -> CellResult:
                    return run_cell_with(model, scenario, spec, user_kwargs, hints=hints, stop_after=broken.index,
                                         memo=memo)

                cause = explain_layer_break(broken, context, rerun, hints=hints, cell_without=cell_without)
            if cause is None:
                cause = explain_break(broken, context, rerun, hints=hints)
            if key is not None:
                store_cause(key, cause)
    return cell(status=Status.BREAKS, boundaries=boundaries, cause=cause, note=note)


def _traced_break(model: LoadedModel, scenario: Scenario, engine: EngineSpec, kwargs: dict,
                  overrides: _Overrides | None, emulation: EngineEmulation | None, layers: ColumnLayers | None,
                  boundaries: tuple[Boundary, ...], broken: Boundary, memo: BlameMemo | None = None,
                  ask: _ParseAsk | None = None) -> tuple[tuple[Boundary, ...], Boundary]:
    """The cell's boundaries with the break's parse asked again with the line tracer, so that its edits cite the
    release's executed lines (a release's own code answers untraced; the tracer costs up to 150 ms a parse, so only
    the parse that a cause reads is traced). Unchanged where the traced run does not give the same boundary.
    `ask`: that parse as the cell's run asked it. When the traced parse answers the same message, the boundary is
    the untraced one with the traced parse's edits (the renders after a parse read its message only); otherwise the
    cell is run again up to the break with that parse traced (its other parses answered from the result cache)."""
    if ask is not None and overrides is None:
        from engine.serving.registry import parse_served

        try:
            _, traced_parse = (memo.parse if memo is not None else _unmemoised)(parse_served, ask.engine, ask.text,
                                                                               ask.request, ask.options)
        except (ValueError, NotImplementedError, ExplorerError):
            return boundaries, broken
        if _message(traced_parse) == _message(broken.parse):
            traced = replace(broken, parse=traced_parse)
            return tuple(traced if b is broken else b for b in boundaries), traced
    try:
        again = _roundtrip(model, scenario, engine, kwargs, broken.index, overrides, emulation, trace_at=broken.index,
                           layers=layers, memo=memo)
    except (_Unavailable, _Failed):
        return boundaries, broken
    traced = next((b for b in again if b.index == broken.index), None)
    if traced is None or (traced.string_prefix, traced.token_prefix) != (broken.string_prefix, broken.token_prefix):
        return boundaries, broken
    return tuple(traced if b is broken else b for b in boundaries), traced


def _message(parse: ParseResult) -> tuple:
    """What a client sends back of a parse (its edits and sources say how the engine got there): a random call id as
    its shape and which earlier call of the reply has the same one (engine.call_ids makes it the session's own)."""
    ids = [c.id for c in parse.tool_calls]
    calls = tuple(((shape, ids.index(c.id)) if (shape := random_shape(c.id or "")) else c.id, c.name, c.arguments)
                  for c in parse.tool_calls)
    return parse.reasoning, parse.content, calls, parse.error, parse.warnings


def _renderers_cell(model: LoadedModel, scenario: Scenario, engine: EngineSpec, kwargs: dict[str, Any],
                    base: dict[str, Any], stop_after: int | None) -> CellResult:
    """The `renderers` column (engine.renderers_column). No cause is attributed: the package's renderers are Python
    ports with no template constructs to undo; the note says how each next prompt was built."""
    from engine import renderers_column

    asked = engine.version
    if asked and asked != base["engine_version"]:
        return CellResult(**base, status=Status.UNAVAILABLE,
                          note=f"renderers {asked[:40]} was asked for, but renderers {base['engine_version']} is the "
                               "one installed (pinned in requirements.txt)")
    try:
        boundaries, note = renderers_column.roundtrip(model, scenario, kwargs, stop_after)
    except renderers_column.Unavailable as err:
        return CellResult(**base, status=Status.UNAVAILABLE, note=str(err))
    except renderers_column.Failed as err:
        return CellResult(**base, status=Status.ERROR, boundaries=err.boundaries, note=str(err))
    status = Status.HOLDS if all(b.holds for b in boundaries) else Status.BREAKS
    return CellResult(**base, status=status, boundaries=boundaries, note=note)


def _rerun_function(context, broken: Boundary, memo: BlameMemo | None = None
                    ) -> Callable[[Change], Boundary | None]:
    """What blame is given: the breaking boundary again, with one change applied (None: the re-run did not get that
    far, e.g. the changed request was refused)."""
    model, scenario, engine, user_kwargs = context.model, context.scenario, context.engine, context.user_kwargs

    def boundary_of(cell: CellResult) -> Boundary | None:
        return next((b for b in cell.boundaries if b.index == broken.index), None)

    def rerun(change: Change) -> Boundary | None:
        index = broken.index
        # Blame asks these re-runs where the string prefix breaks (engine.blame._trial): no token ids. A fix hint's
        # re-runs (kwargs, another engine) say whether the boundary holds, as ids too.
        if isinstance(change, UndoTemplate):
            return rerender(model, change.base or broken, change)
        if isinstance(change, UseParse):
            return boundary_of(run_cell_with(model, scenario, engine, user_kwargs, explain=False, stop_after=index,
                                             overrides=_Overrides(index, parse=change.parse), tokens=False,
                                             memo=memo))
        if isinstance(change, UndoRequestEdit):
            return boundary_of(run_cell_with(model, scenario, engine, user_kwargs, explain=False, stop_after=index,
                                             overrides=_Overrides(index, request_undo=change.edit), tokens=False,
                                             memo=memo))
        if isinstance(change, EchoingClient):
            echoing = replace(scenario, client={})
            return boundary_of(run_cell_with(model, echoing, engine, user_kwargs, explain=False, stop_after=index,
                                             tokens=False, memo=memo))
        if isinstance(change, WithKwargs):
            return boundary_of(run_cell_with(model, scenario, engine, {**user_kwargs, **change.kwargs},
                                             explain=False, memo=memo, stop_after=index))
        if isinstance(change, WithEngine):
            return boundary_of(run_cell_with(model, scenario, change.engine, user_kwargs, explain=False, memo=memo,
                                             stop_after=index))
        raise TypeError(f"unknown change {change!r}")

    return rerun


def rerender(model: LoadedModel, broken: Boundary, change: UndoTemplate) -> Boundary | None:
    """The next prompt rendered again with template constructs undone for one message; the rest is unchanged."""
    request = broken.next_request
    counterfactual = getattr(model.renderer, "render_counterfactual", None)
    if request is None or counterfactual is None:
        return None
    try:
        substitute: dict[int, dict[str, str]] = {}
        for ident, result, written in change.substitute:
            substitute.setdefault(ident, {})[result] = written
        text, _ = counterfactual(request, undo_from=change.message, undo=change.constructs, substitute=substitute)
    except RenderError:
        return None
    next_prompt = Rendered(text=text, source_path=broken.next_prompt.source_path, origin=broken.next_prompt.origin,
                           provenance=lambda: ((-1,) * len(text), (0,) * len(text)))
    string_check = PrefixCheck(len(broken.prev_text), common_prefix(broken.prev_text, text))
    return replace(broken, next_prompt=next_prompt, next_ids=None, string_prefix=string_check, token_prefix=None)


class _Unavailable(ExplorerError):
    pass


class _Failed(ExplorerError):
    def __init__(self, message: str, boundaries: tuple[Boundary, ...]) -> None:
        super().__init__(message)
        self.boundaries = boundaries


def _roundtrip(model: LoadedModel, scenario: Scenario, engine: EngineSpec, kwargs: dict,
               stop_after: int | None = None, overrides: _Overrides | None = None,
               emulation: EngineEmulation | None = None, *, trace_parses: bool = True, tokens: bool = True,
               trace_at: int | None = None, layers: ColumnLayers | None = None, memo: BlameMemo | None = None,
               parse_asks: dict[int, _ParseAsk] | None = None) -> tuple[Boundary, ...]:
    """The scenario's requests through the engine; `trace_parses=False` asks a release's own code for its answers
    without the line tracer (a cell whose cause is not asked for: blame's re-runs, the app's grid), so no traced edit
    is recorded and a vLLM >= 0.25 parse costs a few ms instead of about 150; `trace_at=N` traces only the parse
    that boundary N follows. `layers`: the column's proxies, which rewrite each request the client sends and each
    reply it gets (engine.serving.layers). `memo`: the engines' parses shared with the cell's other runs (blame's
    re-runs). `parse_asks` is given each engine parse as a traced run would ask it, by the boundary it precedes."""
    fmt = get_format(model.spec.family)
    stop = model.spec.stop_tokens[0] if model.spec.stop_tokens else ""
    parsers: dict[str, str] = {}
    traced: bool | None = None  # None: the real backend's own choice, traced where that is cheap
    traced_when_asked: bool | None = None  # what `trace_at` gives the parse it traces
    if engine.is_serving_engine:
        from engine.serving.registry import parse_served, serving_engine

        serving = serving_engine(engine, model.spec.engine_parsers)
        emulation, parsers = serving.engine, serving.parsers
        # A pinned column (not an explicit release) whose parsing falls to the real code traces it, so that a cause
        # cites the release's own line as an emulation's does (a few ms to 150 ms a parse: RealEngine's tracer); an
        # explicit release keeps the backend's default.
        traced_when_asked = True if serving.pinned else None
        traced = traced_when_asked if trace_parses else False
        try:  # a release without the model's parsers cannot serve it: said before its request side is run
            emulation.check_names(parsers.get("reasoning_parser"), parsers.get("tool_call_parser"))
        except ValueError as err:
            raise _Unavailable(str(err)) from err
        except ExplorerError as err:  # its worker hung or died listing them: this cell's error, the next asks again
            raise _Failed(f"{emulation.origin}: {err}", ()) from err

    history: list[dict] = [{"role": "system", "content": scenario.system}] if scenario.system else []
    boundaries: list[Boundary] = []
    pending: tuple[Rendered, tuple | None, Completion, tuple | None, ParseResult, int] | None = None
    call_ids: list[str] = []
    session_ids = SessionCallIds()  # the engine's random ids as stable, distinct ones
    call_cursor = 0
    calls_so_far = 0
    last_request: list[RenderRequest | None] = [None]  # what the latest render was given
    layer_edits: list[tuple[Edit, ...]] = [(), ()]  # the proxies' edits: of the latest request, of the latest reply

    def render(messages: list[dict], generation_prompt: bool) -> tuple[Rendered, tuple[Edit, ...]]:
        try:
            return render_or_refuse(messages, generation_prompt)
        except RenderError as err:
            raise _Failed(str(err), tuple(boundaries)) from err

    def render_or_refuse(messages: list[dict], generation_prompt: bool) -> tuple[Rendered, tuple[Edit, ...]]:
        """The request rendered; RenderError where the template refuses it (the bridge tries other histories)."""
        edits: tuple[Edit, ...] = ()
        # A copy of the list: the history grows after this render, the request it records must not.
        messages = sent = list(messages)
        tools = scenario.tools
        if layers is not None and layers.proxies:
            try:
                forwarded = layers.request(messages, tools)
            except LayerUnavailable as err:
                raise _Unavailable(str(err)) from err
            messages, tools, layer_edits[0] = forwarded.messages, forwarded.tools, forwarded.edits
        to_render, template_kwargs = messages, kwargs
        if emulation is not None:
            prep = engine_request(emulation, model, messages, tools, kwargs, parsers)
            if prep.error:
                raise _Failed(f"{emulation.origin} rejects the next request: {prep.error}", tuple(boundaries))
            to_render, edits = prep.messages, prep.edits
            template_kwargs = template_kwargs_of(prep, kwargs)
            tools = prep.tools if prep.tools is not None else tools
            if overrides is not None and overrides.request_undo is not None and len(boundaries) + 1 == overrides.index:
                to_render = undo_request_edit(to_render, messages, overrides.request_undo)
                edits = tuple(e for e in edits if e != overrides.request_undo)
        else:
            to_render = raw_request(messages, fmt.arguments_in_history)
        rendered = render_kept(model.renderer, to_render, tools, add_generation_prompt=generation_prompt,
                               kwargs=template_kwargs)
        last_request[0] = RenderRequest(to_render, tools, generation_prompt, template_kwargs, sent=sent)
        return rendered, edits

    for position, turn in enumerate(scenario.turns):
        if turn.role in ("user", "tool"):
            history.append(scripted_message(turn, call_ids, call_cursor))
            call_cursor += turn.role == "tool"
            # A client sends the next request once it holds a result for every call of the reply (OpenAI-style
            # servers refuse one that lacks a result: deepseek-recipe does), so consecutive results go together.
            later = scenario.turns[position + 1] if position + 1 < len(scenario.turns) else None
            if turn.role == "tool" and later is not None and later.role == "tool" and call_cursor < len(call_ids):
                continue
            if pending is not None:
                try:
                    boundary = _close_boundary(model, engine, history, pending, render, render_or_refuse,
                                               len(boundaries) + 1, turn.role, last_request, tokens)
                    if layer_edits != [(), ()]:
                        boundary = replace(boundary, layer_edits=layer_edits[1] + layer_edits[0])
                    if engine.flag("strip-thinking-cache") is not None and emulation is not None:
                        boundary = _cache_kept(boundary, emulation, model)
                    boundaries.append(boundary)
                except BridgeUnavailable as err:  # the template refuses the new messages after any closed turn
                    raise _Unavailable(str(err)) from err
                except RenderError as err:  # the bridge reads provenance, whose recording render can refuse
                    raise _Failed(str(err), tuple(boundaries)) from err
                pending = None
                if stop_after is not None and len(boundaries) >= stop_after:
                    break
            continue
        assert turn.assistant is not None
        if engine.kind == "bridge" and boundaries:
            prompt = boundaries[-1].next_prompt
            prompt_ids = boundaries[-1].next_ids
        else:
            prompt, _ = render(history, True)
            prompt_ids = _ids(model, prompt.text) if tokens else None
        completion = fmt.write(turn_as_written(model, turn.assistant, prompt.text), stop)
        completion_ids = sampled_completion_ids(model, completion, turn.noncanonical_tokens) if tokens else None
        if emulation is not None:
            request = dict(reasoning_parser=parsers.get("reasoning_parser"),
                           tool_parser=parsers.get("tool_call_parser"), tools=scenario.tools,
                           chat_template_kwargs=kwargs, history_tool_calls=calls_so_far, tokenizer=model.tokenizer)
            text = emulation.output_text(completion.text, completion.stop_token, request["tool_parser"])
            traced_here = traced if trace_at in (None, len(boundaries) + 1) else False
            options = {"force_reasoning": reasoning_forced(model, prompt.text), "trace": traced_here,
                       "added_tokens": model.spec.added_tokens}
            if parse_asks is not None:
                parse_asks[len(boundaries) + 1] = _ParseAsk(emulation, text, request,
                                                            {**options, "trace": traced_when_asked})
            try:  # (a re-run asks again what the cell asked before its change: from the memo)
                emulation, parsed = (memo.parse if memo is not None else _unmemoised)(parse_served, emulation, text,
                                                                                      request, options)
            except (ValueError, NotImplementedError, ExplorerError) as err:
                raise _Unavailable(str(err)) from err
            if parsed.error:
                raise _Failed(f"{emulation.origin}: {parsed.error}", tuple(boundaries))
        else:
            parsed = fmt.raw_parse(completion.parser_text, reasoning_open=prompt_opens_reasoning(prompt.text))
        if overrides is not None and overrides.parse is not None and len(boundaries) + 1 == overrides.index:
            parsed = overrides.parse
        got = parsed  # what the client reads off the reply (after the column's proxies)
        if layers is not None and layers.proxies:
            try:
                got, layer_edits[1] = layers.response(parsed, emulation)
            except LayerUnavailable as err:
                raise _Unavailable(str(err)) from err
        call_ids = client_call_ids(got, [c.call_id for c in turn.assistant.tool_calls], fmt, session_ids,
                                   calls_so_far)
        call_cursor = 0
        calls_so_far += len(got.tool_calls)
        history.append(client_message(got, call_ids, **scenario.client))
        pending = (prompt, prompt_ids, completion, completion_ids, parsed, len(history) - 1)
    return tuple(boundaries)


def _unmemoised(parse: Callable[..., tuple[Any, ParseResult]], *args: Any) -> tuple[Any, ParseResult]:
    return parse(*args)


# What transformers' apply_chat_template takes as its own arguments, not as template variables.
_CALL_ARGUMENTS = frozenset({"tokenize", "add_generation_prompt", "return_dict", "continue_final_message", "tools",
                             "chat_template", "documents"})


def engine_request(emulation: EngineEmulation, model: LoadedModel, messages: list[dict], tools: list[dict] | None,
                   kwargs: dict, parsers: dict[str, str] | None = None) -> RequestPrep:
    """The engine's request side: nothing to do here when `model` is rendered by the engine's own renderer
    (engine.serving.rendering.served_model: it runs the request side itself); for a model rendered from its Jinja
    template the real backend runs the release's code (which reads the template and the kwargs), the emulations their
    rewrite."""
    if model.served_from is not None:
        return RequestPrep(list(messages), (), None)
    source = getattr(model.renderer, "template_source", None)
    if isinstance(source, str):
        return emulation.prepare_templated_request(messages, tools, kwargs=kwargs, chat_template=source,
                                                   parsers=parsers)
    return emulation.prepare_request(messages, tools)


def template_kwargs_of(prep: RequestPrep, kwargs: dict) -> dict:
    """The template kwargs to render with: those the engine's code resolved (without apply_chat_template's own
    arguments), else the request's."""
    if prep.template_kwargs is None:
        return kwargs
    return {k: v for k, v in prep.template_kwargs.items() if k not in _CALL_ARGUMENTS}


def reasoning_forced(model: LoadedModel, prompt_text: str) -> bool:
    """Whether the real backend splits reasoning off the start of the completion. SGLang forces it when the template
    always thinks or the request turns thinking on: when the generation prompt opens <think>. A model of the
    "always" kind has it open (the backend's default); the others say so by their prompt (DeepSeek V3.1 with thinking
    off does not)."""
    return model.spec.reasoning == "always" or prompt_opens_reasoning(prompt_text)


# The knobs that shape a turn's reasoning; a model that writes none there cannot run a scenario that sets them.
_REASONING_KNOBS = ("reasoning_newlines_before", "reasoning_newlines_after", "newlines_after_think", "close_think")


def turn_as_written(model: LoadedModel, turn: AssistantTurn, prompt_text: str) -> AssistantTurn:
    """The scenario's turn as this model writes it after `prompt_text`: without reasoning when the model does not
    think (manifest `reasoning = "never"`) or the prompt does not open a think block (`"prompt"`: thinking off)."""
    mode = model.spec.reasoning
    if turn.reasoning is None or mode == "always" or (mode == "prompt" and prompt_opens_reasoning(prompt_text)):
        return turn
    knobs = turn.knobs
    varied = [name for name in _REASONING_KNOBS if getattr(knobs, name) != Knobs.__dataclass_fields__[name].default]
    varied += ["truncate_in=reasoning"] if knobs.truncate_in == "reasoning" else []
    if varied:
        why = "it does not think" if mode == "never" else "its prompt does not open a think block (thinking is off)"
        raise _Unavailable(f"{model.id} writes no reasoning here ({why}), and this scenario varies the reasoning "
                           f"({', '.join(varied)})")
    return replace(turn, reasoning=None)


def _cache_kept(boundary: Boundary, engine: EngineEmulation, model: LoadedModel) -> Boundary:
    """The boundary as the engine's prefix cache sees it under a server flag that keeps less of a finished request
    (SGLang's --strip-thinking-cache): the previous sequence is reusable only as far as the release's own code keeps
    it (RealEngine.cache_kept), recorded as an edit at the release's line."""
    cache_kept = getattr(engine, "cache_kept", None)
    prompt_ids, completion_ids = boundary.prev_prompt_ids, boundary.completion_ids
    if cache_kept is None or prompt_ids is None or completion_ids is None or model.tokenizer is None:
        return boundary
    tokens = model.spec.special_tokens
    end_ids = list(token_ids(model.tokenizer, tokens["think_close"])) if tokens.get("think_close") else []
    start_ids = list(token_ids(model.tokenizer, tokens["think_open"])) if tokens.get("think_open") else []
    try:
        found = cache_kept(len(prompt_ids), list(completion_ids),
                           require_reasoning=reasoning_forced(model, boundary.prev_prompt.text),
                           think_end_ids=end_ids, think_start_ids=start_ids)
    except ExplorerError as err:
        raise _Unavailable(str(err)) from err
    total = len(prompt_ids) + len(completion_ids)
    if found is None or found["kept"] >= total or boundary.token_prefix is None:
        return boundary
    kept = found["kept"]
    path, _, line = found["where"].rpartition(":")
    edit = Edit("cache_kept_prompt", f"{total} tokens (prompt and completion)", f"{kept} tokens (the prompt)",
                Location(engine.origin, path, int(line), text=found["line"]),
                f"{found['method']}: with --strip-thinking-cache and {found['reasoning_tokens']} reasoning tokens in "
                f"the reply, the cache keeps the previous prompt's {kept} tokens, not the completion's "
                f"{len(completion_ids)}")
    kept_chars = len(boundary.prev_prompt.text)
    return replace(boundary, token_prefix=PrefixCheck(total, min(boundary.token_prefix.common, kept)),
                   string_prefix=PrefixCheck(boundary.string_prefix.prev_len,
                                             min(boundary.string_prefix.common, kept_chars)),
                   layer_edits=boundary.layer_edits + (edit,))


def _close_boundary(model: LoadedModel, engine: EngineSpec, history, pending, render, render_or_refuse, index,
                    trigger, last_request, tokens: bool = True) -> Boundary:
    prompt, prompt_ids, completion, completion_ids, parsed, assistant_index = pending
    prev_text = prompt.text + completion.text
    prev_ids = prompt_ids + completion_ids if prompt_ids is not None and completion_ids is not None else None
    if engine.kind == "bridge":
        next_prompt = bridge_prompt(model, prompt, completion, history[assistant_index], history[assistant_index + 1:],
                                    assistant_index, lambda messages: render_or_refuse(messages, True)[0])
        request_edits: tuple[Edit, ...] = ()
        next_ids = bridge_ids(model, prev_ids, next_prompt.text[len(prev_text):])
    else:
        next_prompt, request_edits = render(history, True)
        next_ids = _ids(model, next_prompt.text) if tokens else None
    string_check = PrefixCheck(len(prev_text), common_prefix(prev_text, next_prompt.text))
    token_check = None
    if prev_ids is not None and next_ids is not None:
        token_check = PrefixCheck(len(prev_ids), common_prefix(prev_ids, next_ids))
    return Boundary(index, trigger, prompt, completion, completion_ids, prompt_ids, parsed, request_edits,
                    next_prompt, next_ids, string_check, token_check, last_request[0])
