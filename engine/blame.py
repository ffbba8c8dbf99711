"""Cause attribution by counterfactual: the change to the model's text whose undo keeps the prefix.

A boundary breaks because something between the model's output and the next prompt changed what the model wrote.
Blame lists the candidate changes, undoes each alone through a re-run function the simulator hands in (blame never
runs the simulator itself), and names the one whose undo makes the boundary hold, or moves the break furthest:
  - engine: each parser or request-side edit (text edits, and what is not a text edit: a lost call, a renumbered id,
    null for ""), undone in the engine's result or request;
  - client: the scenario's client setting, replaced by a client that echoes everything;
  - template: each construct the template (or encoder) ran for the messages whose rendering broke (a filter or string
    method on their fields, a condition, a re-printed value, markup), undone from the broken message on
    (engine.render.constructs); conditions on one kwarg also together, everywhere. The value's path through the
    template's bindings too: each `set` (plain, `namespace` attribute, an encoder's assignment) and each argument of
    a macro call, had it assigned the model's own text, or, for a number computed for a message, that message's
    index (an index off by one upstream, not the condition that reads it).
Among the undos that keep the prefix, the smallest change to the next prompt wins; along the value's path, the
construct furthest upstream. The construct is the primary location; the line that emitted the differing character
comes second. A break that no undo moves is blamed on the emitting construct, and the proof says that nothing else
moved it. Where the break is in the opening of the model's turn (the generation prompt wrote `<think>`, the history
writes `<think>\n`), the cause is the disagreement itself, located at both constructs and proved by re-rendering
each printing what the other printed.
Fix hints are re-run too, and ranked: a switch that keeps the prompt the model answered, the client setting, other
versions of the same engine, the append-only bridge, and only then a switch that changes what the model is asked to
do (turning reasoning off), saying so.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import RenderError
from engine.models import LoadedModel
from engine.prefix import common_prefix, common_suffix
from engine.render.constructs import substitution_key
from engine.scenario import CLIENT_SETTINGS, SCENARIOS_DIR, Scenario
from engine.serving.spec import EngineSpec
from engine.types import (
    Boundary,
    Cause,
    Change,
    EchoingClient,
    Edit,
    Fix,
    Location,
    ParseResult,
    RenderRequest,
    UndoRequestEdit,
    UndoTemplate,
    UseParse,
    WithEngine,
    WithKwargs,
)

Rerun = Callable[[Change], Boundary | None]
MAX_TEMPLATE_CANDIDATES = 100  # constructs tried per break, nearest to the break first
HOLDING_ENOUGH = 3  # candidates that keep the prefix, found in that order, to choose the cause from


@dataclass(frozen=True)
class BlameContext:
    model: LoadedModel
    scenario: Scenario
    engine: EngineSpec  # as the cell was asked for: raw, bridge, vllm, sglang@0.5.12, ...
    user_kwargs: dict[str, Any]
    kwargs: dict[str, Any]  # the kwargs the cell rendered with (model defaults, scenario, user)


@dataclass(frozen=True)
class _Trial:
    """One undone change and what the re-run gave: the new common prefix (characters), whether it holds, and, when it
    holds, how many characters of the next prompt the change touched (the smallest change that keeps the prefix is
    the cause)."""

    common: int
    holds: bool
    change_size: int = 0


def _change_size(a: str, b: str) -> int:
    """How many characters of `a` and `b` differ: outside their common prefix and suffix, and within what is left
    (when short) only the characters a diff does not match (two newlines put around a marker are 2, not the marker's
    length twice)."""
    start = common_prefix(a, b)
    end = common_suffix(a, b, min(len(a), len(b)) - start)
    differing = len(a) + len(b) - 2 * (start + end)
    if start + end < min(len(a), len(b)) and differing <= 200:
        a, b = a[start:len(a) - end], b[start:len(b) - end]
        matched = sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
        return differing - 2 * matched
    return differing


def _trial(rerun: Rerun, change: Change, original: Boundary | None = None) -> _Trial | None:
    boundary = rerun(change)
    if boundary is None:
        return None
    holds = boundary.string_prefix.holds
    # The size decides only among trials that hold (the ranks read it for those alone).
    size = _change_size(original.next_prompt.text, boundary.next_prompt.text) if original is not None and holds else 0
    return _Trial(boundary.string_prefix.common, holds, size)


def _prefix_words(boundary: Boundary, trial: _Trial) -> str:
    total = boundary.string_prefix.prev_len
    if trial.holds:
        return f"the boundary holds ({total}/{total} characters)"
    return f"the break moves from character {boundary.string_prefix.common} to {trial.common} of {total}"


def _snippet(text: str, at: int, width: int = 24) -> str:
    """The text from the break, begun at the start of a markup token the break falls in (`<think>` vs `<tool_call>`
    differ at their second character: both shown whole)."""
    start = text.rfind("<", max(0, at - 16), at + 1)
    if start < 0 or ">" in text[start:at]:
        start = at
    return text[start:start + width]


def explain_break(boundary: Boundary, context: BlameContext, rerun: Rerun, *, hints: bool = True) -> Cause:
    """The cause of `boundary`'s break. `hints=False` leaves `fix` None: the hint re-runs the cell once per kwarg and
    engine version, which the fuzzer, counting causes over thousands of conversations, does not need."""
    if boundary.string_prefix.holds:
        cause = _tokenizer_cause(boundary, context)
    else:
        cause = (_engine_cause(boundary, context, rerun) or _client_cause(boundary, context, rerun)
                 or _template_cause(boundary, context, rerun))
    if hints:
        cause = replace(cause, fix=_fix_hint(boundary, context, rerun, cause))
    return cause


# -- tokenizer ---------------------------------------------------------------------------------------------------


def _tokenizer_cause(boundary: Boundary, context: BlameContext) -> Cause:
    at = boundary.token_prefix.common if boundary.token_prefix else 0
    prev_ids, next_ids = boundary.prev_ids or (), boundary.next_ids or ()
    model = context.model
    tokenizer_file = model.spec.assets["tokenizer"].hub_file if "tokenizer" in model.spec.assets else "tokenizer"
    return Cause(
        stage="tokenizer", kind="retokenised",
        locations=(Location(f"tokenizer {model.id}", tokenizer_file, 0),),
        changed=(f"the text is identical ({boundary.string_prefix.prev_len} characters), but at token {at} the "
                 f"model's ids {list(prev_ids[at:at + 3])} are re-tokenized as {list(next_ids[at:at + 3])}"),
        fix=None,
        proof="string prefix holds and token prefix breaks: the same characters, tokenized whole, give other ids",
        detail=(f"same text, different ids at token {at}: previous {list(prev_ids[at:at + 3])} vs next "
                f"{list(next_ids[at:at + 3])}; re-tokenizing the whole prompt does not give back the completion's "
                "own ids"),
    )


# -- engine ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _EngineCandidate:
    change: Change
    edit: Edit
    field: str  # reasoning | content | arguments | id | calls | request
    order: int


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def _with_edit_undone(parse: ParseResult, edit: Edit, written: ParseResult, completion: str
                      ) -> tuple[ParseResult, str] | None:
    """The engine's result with one edit's output put back as its input, and the field it was found in.

    A reasoning or content undo must give back text the model wrote: text the engine moved into one of the tool calls
    it returned (their markup) is not lost, and putting it back as content would only duplicate the model's bytes.
    """
    before, after = edit.before, edit.after
    moved_to_calls = any(call.name and call.name in before for call in parse.tool_calls)

    def own(field_text: str | None) -> bool:
        return field_text is not None and before in completion and not moved_to_calls

    if after and parse.reasoning is not None and parse.reasoning == after and own(written.reasoning):
        return replace(parse, reasoning=before), "reasoning"
    if after and parse.content is not None and parse.content == after and own(written.content):
        return replace(parse, content=before), "content"
    for i, call in enumerate(parse.tool_calls):
        if after and call.arguments == after:
            calls = list(parse.tool_calls)
            calls[i] = replace(call, arguments=before)
            return replace(parse, tool_calls=tuple(calls)), "arguments"
        if after and call.id == after and before:
            calls = list(parse.tool_calls)
            calls[i] = replace(call, id=before)
            return replace(parse, tool_calls=tuple(calls)), "id"
    if not after:
        if not parse.content and own(written.content):
            return replace(parse, content=before), "content"
        return None
    if parse.reasoning and after in parse.reasoning and own(written.reasoning):
        return replace(parse, reasoning=parse.reasoning.replace(after, before, 1)), "reasoning"
    if parse.content and after in parse.content and own(written.content):
        return replace(parse, content=parse.content.replace(after, before, 1)), "content"
    if before not in completion:
        return None  # inside a call's arguments, only what the model wrote can be put back
    escaped_after = json.dumps(after, ensure_ascii=False)[1:-1]
    escaped_before = json.dumps(before, ensure_ascii=False)[1:-1]
    for i, call in enumerate(parse.tool_calls):
        if escaped_after and escaped_after in call.arguments:
            calls = list(parse.tool_calls)
            calls[i] = replace(call, arguments=call.arguments.replace(escaped_after, escaped_before, 1))
            return replace(parse, tool_calls=tuple(calls)), "arguments"
    return None


def _producing_edit(value: str, written: str, steps: tuple[Edit, ...], fallback: Edit | None) -> Edit | None:
    """The recorded edit that made the engine's `value` out of what the model `written`: the first (in pipeline order)
    whose input holds the model's text and whose output no longer does; else the one whose output is the value;
    else the last whose output is part of it."""
    if written:
        for edit in steps:
            if written in edit.before and written not in edit.after:
                return edit
    for edit in steps:
        if edit.after == value and edit.before != edit.after:
            return edit
    for edit in reversed(steps):
        if edit.after and edit.after in value:
            return edit
    return fallback


def _field_differences(parse: ParseResult, written: ParseResult) -> list[tuple[ParseResult, Edit, str]]:
    """Each field where the engine's result differs from what the model wrote (the lossless split), with the field
    put back as written: the reasoning, the content, a call's arguments or id, the calls themselves, null for ""."""
    found: list[tuple[ParseResult, Edit, str]] = []
    sources = dict(parse.sources)  # the real code's line that decided a field, where the tracer saw it
    edits = parse.edits

    def add(result: ParseResult, edit: Edit | None, field: str) -> None:
        # A field without a line of the release's that decided it (no recorded edit, no traced source) is not named.
        if edit is not None:
            found.append((result, edit, field))

    if len(parse.tool_calls) < len(written.tool_calls):
        kept = {call.name for call in parse.tool_calls}
        lost = [call.name for call in written.tool_calls if call.name not in kept] or [written.tool_calls[-1].name]
        # The step that cut the lost call's markup out of the text.
        where = _nearest_line(parse, "calls")
        edit = next((e for e in edits if lost[0] in e.before and lost[0] not in e.after), None) or (where and Edit(
            "call_lost", f"{len(written.tool_calls)} tool calls", f"{len(parse.tool_calls)} tool calls", where,
            "the engine returned fewer tool calls than the model wrote"))
        add(replace(parse, tool_calls=written.tool_calls), edit, "calls")
    for i, (call, own) in enumerate(zip(parse.tool_calls, written.tool_calls)):
        if _json_or_none(call.arguments) != _json_or_none(own.arguments) or (
                _json_or_none(own.arguments) is None and call.arguments != own.arguments):
            calls = list(parse.tool_calls)
            calls[i] = replace(call, arguments=own.arguments)
            where = sources.get(f"arguments of {call.name}") or _nearest_line(parse, "arguments")
            edit = _producing_edit(call.arguments, own.arguments, edits, where and Edit(
                "args_rewritten", own.arguments, call.arguments, where, "the arguments are not the model's"))
            add(replace(parse, tool_calls=tuple(calls)), edit and replace(edit, before=own.arguments,
                                                                          after=call.arguments), "arguments")
        if own.id and call.id != own.id:
            calls = list(parse.tool_calls)
            calls[i] = replace(call, id=own.id)
            where = _nearest_line(parse, "id")
            edit = next((e for e in edits if e.before == own.id and e.after == call.id), None) or (where and Edit(
                "call_id_replaced", own.id, call.id or "", where, "the tool-call id the model wrote is replaced"))
            add(replace(parse, tool_calls=tuple(calls)), edit, "id")
    for field in ("reasoning", "content"):
        value, own = getattr(parse, field), getattr(written, field)
        if value == own or (not value and not own and field == "reasoning"):
            continue
        where = sources.get(field) or _nearest_line(parse, field)
        if field == "content" and value is None and own == "":
            edit = next((e for e in edits if e.after == "null"), None) or (where and Edit(
                "content_null", '""', "null", where, "an empty answer is returned as null"))
        else:
            edit = _producing_edit(value or "", own or "", edits, where and Edit(
                f"{field}_rewritten", own or "", value or "", where, f"the {field} is not the model's"))
            edit = edit and replace(edit, before=own or "", after=value or "")
        add(replace(parse, **{field: own if own is not None else ""}), edit, field)
    return found


def _nearest_line(parse: ParseResult, field: str) -> Location | None:
    """A line of the release's that this parse executed and that acted on `field` (a traced source of it, an edit whose
    step names it), else any line it recorded (its last edit, a traced source); None when it recorded none."""
    named = [location for name, location in parse.sources if field in name] + [
        e.location for e in parse.edits if field in e.step]
    recorded = [e.location for e in parse.edits] + [location for _, location in parse.sources]
    return next((location for location in (*named, *reversed(recorded)) if location.line > 0), None)


def _engine_candidates(boundary: Boundary, context: BlameContext) -> list[_EngineCandidate]:
    parse = boundary.parse
    written = _written_fields(boundary, context)
    candidates: list[_EngineCandidate] = []
    for edit in parse.edits:
        undone = _with_edit_undone(parse, edit, written, boundary.completion.text) if written is not None else None
        if undone is not None:
            candidates.append(_EngineCandidate(UseParse(undone[0]), edit, undone[1], len(candidates)))
    if written is not None:
        for result, edit, field in _field_differences(parse, written):
            candidates.append(_EngineCandidate(UseParse(result), edit, field, len(candidates)))
    for edit in boundary.request_edits:
        if edit.before != edit.after:
            candidates.append(_EngineCandidate(UndoRequestEdit(edit), edit, "request", len(candidates)))
    return candidates


def _written_fields(boundary: Boundary, context: BlameContext) -> ParseResult | None:
    from engine.formats import get_format
    from engine.formats.base import prompt_opens_reasoning

    try:
        fmt = get_format(context.model.spec.family)
    except KeyError:
        return None
    return fmt.raw_parse(boundary.completion.parser_text,
                         reasoning_open=prompt_opens_reasoning(boundary.prev_prompt.text))


def _engine_kind(candidate: _EngineCandidate, written: ParseResult | None) -> str:
    edit, field = candidate.edit, candidate.field
    lost_call = field == "content" and written is not None and any(
        call.name and call.name in edit.before and call.name not in edit.after for call in written.tool_calls)
    if field == "calls" or lost_call:
        return "call-lost"
    if field == "id":
        return "call-id-renumbered"
    if edit.after == "null" and edit.before in ('""', ""):
        return "content-null"
    if field in ("arguments", "request") and (edit.before.lstrip().startswith("{") or edit.after.startswith("{")):
        return _arguments_kind(edit.before, edit.after)
    if field == "arguments":
        return "args-reserialised"
    if field == "request":
        return "reasoning-dropped" if "reasoning" in edit.before else "args-reserialised"
    if edit.before.strip() == edit.after.strip():
        return "reasoning-trimmed" if field == "reasoning" else "whitespace-normalised"
    if not edit.after.strip():
        return "reasoning-dropped" if field == "reasoning" else "content-dropped"
    return "text-rewritten"


def _arguments_kind(before: str, after: str) -> str:
    old, new = _json_or_none(before), _json_or_none(after)
    if not isinstance(new, dict) or (isinstance(new, dict) and not new and before.strip() not in ("", "{}")):
        return "args-dropped"
    if not isinstance(old, dict):
        return "args-reserialised"
    if old == new and list(old) == list(new):
        return "args-reserialised"
    if old.keys() == new.keys() and any(type(old[k]) is not type(new[k]) for k in old):
        return "args-type-coerced"
    return "args-reserialised"


def _engine_cause(boundary: Boundary, context: BlameContext, rerun: Rerun) -> Cause | None:
    if not context.engine.is_serving_engine:
        return None
    trials = []
    for candidate in _engine_candidates(boundary, context):
        trial = _trial(rerun, candidate.change, boundary)
        if trial is not None and trial.common > boundary.string_prefix.common:
            trials.append((trial, candidate))
    if not trials:
        return None
    # Holding first; among those the smallest change to the next prompt, then the engine's own order of steps.
    trial, candidate = min(trials, key=lambda t: (not t[0].holds, t[0].change_size if t[0].holds else -t[0].common,
                                                  t[1].order))
    edit = candidate.edit
    kind = _engine_kind(candidate, _written_fields(boundary, context))
    at = boundary.string_prefix.common
    loc = edit.location
    return Cause(
        stage="parser", kind=kind,
        locations=(replace(loc, text=edit.description),),
        changed=_changed_by_engine(edit, candidate.field),
        fix=None,
        proof=f"re-run with {edit.step} undone ({edit.location}): {_prefix_words(boundary, trial)}",
        detail=(f"{edit.description}: {edit.before[:80]!r} -> {edit.after[:80]!r}; at char {at}: previous "
                f"{_snippet(boundary.prev_text, at)!r} vs next {_snippet(boundary.next_prompt.text, at)!r}"),
        edit=edit,
    )


def _changed_by_engine(edit: Edit, field: str) -> str:
    if field == "request":
        return f"the engine's request side turned {edit.before[:60]!r} into {edit.after[:60]!r} before rendering"
    return f"the model wrote {edit.before[:60]!r} ({field}); the engine returned {edit.after[:60]!r}"


# -- client ------------------------------------------------------------------------------------------------------


def _client_cause(boundary: Boundary, context: BlameContext, rerun: Rerun) -> Cause | None:
    """The scenario's client setting is the cause when the same cell with a client that echoes everything holds, or
    breaks only later."""
    scenario = context.scenario
    if not scenario.client:
        return None
    trial = _trial(rerun, EchoingClient())
    if trial is None or trial.common <= boundary.string_prefix.common:
        return None
    setting, value = next(iter(scenario.client.items()))
    source = SCENARIOS_DIR.parent / scenario.source if scenario.source else None
    lines = source.read_text(encoding="utf-8").splitlines() if source is not None and source.is_file() else []
    line = next((n for n, text in enumerate(lines, 1) if text.strip().startswith(f"{setting}:")), 0)
    field = setting.removeprefix("send_") + ("_content" if setting == "send_reasoning" else "")
    return Cause(
        stage="client", kind="client-dropped-field",
        locations=(Location(f"client (scenario {scenario.id})", scenario.source or scenario.id, line,
                            text=lines[line - 1].strip() if line else ""),),
        changed=f"the client sent the assistant turn back without {field} ({setting}={value!r})",
        fix=None,
        proof=f"re-run with a client that echoes what the engine returned: {_prefix_words(boundary, trial)}",
        detail=f"the client sends the assistant turn back with {setting}={value!r}; with a client that echoes what "
               "the engine returned, this boundary holds",
    )


# -- template ----------------------------------------------------------------------------------------------------


def _break_message(boundary: Boundary) -> int:
    """The message whose rendering holds the first differing character of the next prompt (its assistant turn when
    that character is scaffolding)."""
    rendered = boundary.next_prompt
    at = min(boundary.string_prefix.common, len(rendered.text) - 1)
    if at < 0:
        return -1
    index = rendered.message_index
    if index[at] >= 0:
        return index[at]
    later = [m for m in index[at:] if m >= 0]
    return later[0] if later else max(index, default=-1)


def _emitting_line(boundary: Boundary) -> int:
    rendered = boundary.next_prompt
    at = boundary.string_prefix.common
    pos = min(at, len(rendered.text) - 1)
    if pos < 0:
        return 0
    # A break at the first character of an output chunk means the chunk before it ended early (a branch that left
    # something out): the line that emitted that chunk; unless the next prompt has characters of its own there (then
    # that chunk put them in, or put them in place of the model's).
    if 0 < pos < len(rendered.text) and rendered.source_line[pos] != rendered.source_line[pos - 1]:
        aligned = _alignment(boundary.prev_text, rendered.text, at)
        if aligned is None or not aligned[0]:
            pos -= 1
    return rendered.source_line[pos]


def _template_cause(boundary: Boundary, context: BlameContext, rerun: Rerun) -> Cause:
    model = context.model
    renderer = model.renderer
    rendered = boundary.next_prompt
    at = boundary.string_prefix.common
    lines = renderer.source_lines()
    emit_line = _emitting_line(boundary)
    emit_location = Location(rendered.origin, rendered.source_path, emit_line,
                             text=lines[emit_line - 1].strip() if 0 < emit_line <= len(lines) else "")
    changed = _changed_in_template(boundary)
    base = boundary
    if context.engine.is_serving_engine:
        # The template's constructs act on what the engine handed over; had the engine kept the model's fields, would
        # the template still break here? Then blame the template on that request (the same cause as the raw column).
        written = _written_fields(boundary, context)
        again = rerun(UseParse(written)) if written is not None else None
        if again is not None and not again.string_prefix.holds and \
                again.string_prefix.common == boundary.string_prefix.common:
            base = again
    found = _template_counterfactual(base, context, rerun, emit_line)
    opening = _opening_cause(boundary, context, rerun, found, emit_location, changed)
    if opening is not None:
        return opening
    if found is not None:
        trial, found_locations, construct_kind, how, whitespace_change = (
            found.trial, found.locations, found.construct_kind, found.how, found.whitespace_change)
        location = found_locations[0]
        kind = _template_kind(boundary, construct_kind, whitespace_change, _written_fields(boundary, context))
        locations = found_locations if any(_same_place(loc, emit_location) for loc in found_locations) else (
            *found_locations, emit_location)
        return Cause(
            stage="template", kind=kind, locations=locations, changed=changed, fix=None,
            proof=(f"re-rendered with {how}" + (" (and the engine's result replaced by the model's fields as written)"
                                                  if base is not boundary else "") +
                   f": {_prefix_words(boundary, trial)}"),
            detail=f"at char {at}: previous {_snippet(boundary.prev_text, at)!r} vs next "
                   f"{_snippet(rendered.text, at)!r}; changed by: {location.text}; emitted by: {emit_location.text}",
        )
    kind = _template_kind(boundary, "output:output", "", _written_fields(boundary, context))
    opaque = getattr(renderer, "opaque", "")  # a compiled renderer: there is nothing to undo
    return Cause(
        stage="template", kind=kind, locations=(emit_location,), changed=changed, fix=None,
        proof=f"{opaque}; the first differing character is its output" if opaque else
              "no construct of the template that ran for this message, undone alone, moves the break: the first "
              "differing character is this line's own output",
        detail=f"at char {at}: previous {_snippet(boundary.prev_text, at)!r} vs next {_snippet(rendered.text, at)!r}; "
               f"emitted by: {emit_location.text}",
    )


@dataclass(frozen=True)
class _Counterfactual:
    """The template construct blamed: the re-run that proved it, its locations (the construct first), its kind
    ("op:trim", "condition:if", "set:argument", ...), how it was undone, whether it only changed whitespace ("trim",
    "normalise", ""), and the change itself."""

    trial: _Trial
    locations: tuple[Location, ...]
    construct_kind: str
    how: str
    whitespace_change: str
    change: UndoTemplate


def _opening_cause(boundary: Boundary, context: BlameContext, rerun: Rerun, found: _Counterfactual | None,
                   emit_location: Location, changed: str) -> Cause | None:
    """The generation prompt and the history disagree on how the model's turn opens: the break is in the text the
    generation prompt wrote for the turn (`<think>` where the history writes `<think>\n`), or the history puts
    scaffolding of its own before the model's first token. Located at both constructs, the generation prompt's
    first; each proved by a re-render that makes it print what the other printed."""
    gen_text, prev, nxt = boundary.prev_prompt.text, boundary.prev_text, boundary.next_prompt.text
    at = boundary.string_prefix.common
    renderer = context.model.renderer
    counterfactual = getattr(renderer, "render_counterfactual", None)
    table_of = getattr(renderer, "construct_table", None)
    request = boundary.next_request
    if at > len(gen_text) or request is None or counterfactual is None or table_of is None or \
            _reasoning_lost_at_break(boundary):
        return None
    aligned = _alignment(prev, nxt, at)
    if aligned is None:
        return None
    inserted, skipped = aligned
    if at == len(gen_text) and not (inserted and not skipped):
        return None  # at the model's first token only scaffolding the history puts before it is the opening's
    turns = [i for i, m in enumerate(request.messages) if m.get("role") == "assistant"]
    if not turns:
        return None
    asked = replace(request, messages=request.messages[:turns[-1]], add_generation_prompt=True)
    table = table_of()
    outputs = _generation_prompt_outputs(counterfactual, asked, gen_text, table)
    gen_pos = at - 1 if inserted and not skipped else at
    opening = next(((c, value, begin) for c, value, begin in outputs if begin <= gen_pos < begin + len(value)), None)
    if opening is None:
        return None  # the break is not in the generation prompt's text
    start = min(begin for _, _, begin in outputs)
    lines = renderer.source_lines()

    def line_text(line: int) -> str:
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    origin, path = boundary.next_prompt.origin, boundary.next_prompt.source_path
    construct, value, begin = opening
    gen_location = Location(origin, path, construct.line, text=line_text(construct.line))
    generation_proof = _generation_as_history(boundary, rerun, asked, opening, inserted, skipped)
    history = _history_as_generated(boundary, rerun, counterfactual, table, inserted, skipped)
    if history is None:
        return None
    hist_construct, trial, how = history
    hist_location = Location(origin, path, hist_construct.line, text=line_text(hist_construct.line))
    position = at if inserted else at - 1
    if found is not None and found.construct_kind.startswith("set:") and found.trial.common > at and any(
            isinstance(value, str) and _covering([value], nxt, position) is not None
            for _, value, _ in found.change.substitute):
        # The history printed a value bound upstream (a macro's parameter, a `set`): that binding is its construct.
        hist_location, trial, how = found.locations[0], found.trial, f"re-rendered with {found.how}"
    proofs = [p for p in (generation_proof, f"{how}: {_prefix_words(boundary, trial)}" if trial else None) if p]
    if not proofs:
        return None
    rendered = nxt[start:start + len(gen_text) - start + inserted - skipped]
    locations = (gen_location, hist_location) + (() if any(_same_place(loc, emit_location) for loc in (
        gen_location, hist_location)) else (emit_location,))
    return Cause(
        stage="template", kind="generation-prompt-differs", locations=locations, changed=changed, fix=None,
        proof="; ".join(proofs),
        detail=(f"the generation prompt opened the turn with {gen_text[start:]!r} (line {gen_location.line}); the "
                f"history renders {rendered!r} (line {hist_location.line}) before the model's text"),
    )


def _generation_prompt_outputs(counterfactual: Callable, asked: RenderRequest, gen_text: str, table
                               ) -> list[tuple[object, str, int]]:
    """The generation prompt's outputs (construct, text, where it starts), last first: the outputs after the last
    message, as the instrumented render of the request the model answered records them."""
    try:
        text, evaluations = counterfactual(asked)
    except Exception:  # noqa: BLE001 - the instrumented render is a second opinion
        return []
    if text != gen_text:
        return []
    outputs, end = [], len(text)
    for evaluation in reversed(evaluations):
        construct = table.constructs[evaluation.construct]
        if construct.kind != "output":
            continue
        value = evaluation.before
        if evaluation.message >= 0 or not isinstance(value, str) or not text.endswith(value, 0, end):
            break
        if value:
            outputs.append((construct, value, end - len(value)))
            end -= len(value)
    return outputs


def _history_as_generated(boundary: Boundary, rerun: Rerun, counterfactual: Callable, table, inserted: int,
                          skipped: int) -> tuple[object, _Trial | None, str] | None:
    """The history's output at the break (the one whose text the next prompt has there, or that ended just before
    text the generation prompt had), re-rendered printing what the generation prompt printed there."""
    prev, nxt, at = boundary.prev_text, boundary.next_prompt.text, boundary.string_prefix.common
    try:
        _, evaluations = counterfactual(boundary.next_request)
    except Exception:  # noqa: BLE001 - the instrumented render is a second opinion
        return None
    undo_from = max(_break_message(boundary) - 1, 0)
    position = at if inserted else at - 1
    try:
        line = boundary.next_prompt.source_line[position]
    except (RenderError, IndexError):
        return None
    for evaluation in evaluations:
        construct = table.constructs[evaluation.construct]
        value = evaluation.before
        if construct.kind != "output" or construct.line != line or evaluation.message < undo_from or \
                not isinstance(value, str) or not value:
            continue
        start = nxt.find(value, max(0, position - len(value) + 1))
        if not 0 <= start <= position < start + len(value):
            continue
        offset = at - start
        instead = value[:offset] + prev[at:at + skipped] + value[offset + inserted:]
        change = UndoTemplate(undo_from, substitute=((construct.id, value, instead),), base=boundary)
        trial = _trial(rerun, change, boundary)
        how = (f"re-rendered the history with {construct.description} (line {construct.line}) printing "
               f"{instead[max(0, offset - 12):offset + skipped + 12]!r} as the generation prompt did")
        return construct, trial if trial is not None and trial.common > at else None, how
    return None


def _generation_as_history(boundary: Boundary, rerun: Rerun, asked: RenderRequest, opening: tuple, inserted: int,
                           skipped: int) -> str | None:
    """The generation prompt re-rendered with its output at the break printing what the history printed there: the
    previous prompt and the model's text are then a prefix of the next prompt (or the break moves on)."""
    construct, value, begin = opening
    nxt, at, completion = boundary.next_prompt.text, boundary.string_prefix.common, boundary.completion.text
    offset = at - begin
    if offset + skipped > len(value):
        return None
    instead = value[:offset] + nxt[at:at + inserted] + value[offset + skipped:]
    again = rerun(UndoTemplate(-1, substitute=((construct.id, value, instead),),
                               base=replace(boundary, next_request=asked)))
    if again is None:
        return None
    sequence = again.next_prompt.text + completion
    common = common_prefix(sequence, nxt)
    if common <= at:
        return None
    outcome = (f"the previous prompt and the model's text are then a prefix of the next prompt "
               f"({len(sequence)}/{len(sequence)} characters)" if common >= len(sequence) else
               f"the break moves from character {at} to {common}")
    return (f"re-rendered the generation prompt with {construct.description} (line {construct.line}) printing "
            f"{instead!r}: {outcome}")


def _same_place(a: Location, b: Location) -> bool:
    return a.path == b.path and a.line <= b.line <= (a.end_line or a.line)


def _template_counterfactual(boundary: Boundary, context: BlameContext, rerun: Rerun, emit_line: int
                             ) -> _Counterfactual | None:
    renderer = context.model.renderer
    table_of = getattr(renderer, "construct_table", None)
    counterfactual = getattr(renderer, "render_counterfactual", None)
    if table_of is None or counterfactual is None or boundary.next_request is None:
        return None
    target = _break_message(boundary)
    # From the message before the break's on: a turn's closing markup (the transition after a user message) is
    # emitted while that message renders. Undoing a construct there changes only what follows it in the next
    # prompt, since the previous prompt rendered it before the break.
    undo_from = max(target - 1, 0)
    try:
        traced_text, evaluations = counterfactual(boundary.next_request)
    except Exception:  # noqa: BLE001 - the instrumented render is a second opinion; the emitting line stands
        return None
    agreed = common_prefix(boundary.prev_text, traced_text)
    runs_in_trace = _runs_by_construct(evaluations)
    table = table_of()
    constructs = table.constructs
    ran: dict[int, list] = {}
    order: dict[int, int] = {}  # each construct's first run for the broken message: upstream runs first
    for position, evaluation in enumerate(evaluations):
        if evaluation.message >= undo_from:
            ran.setdefault(evaluation.construct, []).append(evaluation)
        if evaluation.message == target:
            order.setdefault(evaluation.construct, position)
    groups = _candidate_groups(constructs, ran, emit_line)
    # Reasoning missing at the break: a branch left it out, far more often than a transform (conditions first, and
    # the first one whose flip keeps the prefix is the cause).
    reasoning_lost = _reasoning_lost_at_break(boundary)
    if reasoning_lost:
        groups.sort(key=lambda group: group[0].kind != "condition")
    # The value's path through the template's bindings (`set`, a macro's parameter), each tried whatever else holds:
    # a number that is not the index of the message it was computed for, a text that is not what the model wrote.
    path = [((constructs[ident],), change) for ident, change in _index_bindings(evaluations, constructs)]
    reprinting = _reprinting_ops(boundary, ran, constructs)
    for ident in reprinting:
        if constructs[ident].kind == "set":
            change = _reprinted_as_written(boundary, rerun, ran, constructs, ident, undo_from)
            if change is not None:
                path.append(((constructs[ident],), change))
    path += [((constructs[ident],), change)
             for ident, change in _emptied_bindings(boundary, ran, constructs, undo_from, emit_line, target)]
    candidates = [(group, UndoTemplate(undo_from, frozenset(c.id for c in group), base=boundary))
                  for group in groups if group[0].kind != "output"]
    # Every condition on one template switch (a kwarg such as drop_thinking tested in several places, also outside
    # any message, e.g. where the history is prepared), undone everywhere: together, and each alone.
    for group in _switch_groups(constructs, {e.construct for e in evaluations}, frozenset(context.kwargs),
                                table.aliases):
        for part in (group, *((c,) for c in group)) if len(group) > 1 else (group,):
            candidates.append((part, UndoTemplate(-1, frozenset(c.id for c in part), base=boundary)))
    # An op that printed a value anew (`|tojson`, `to_json`, a variable set above): had it printed the model's own
    # text for each value. An output of the template's own markup: had it printed what the model wrote there.
    for ident in reprinting:
        if constructs[ident].kind == "set":
            continue  # tried above, on the value's path
        change = _reprinted_as_written(boundary, rerun, ran, constructs, ident, undo_from)
        if change is not None:
            candidates.append(((constructs[ident],), change))
    for ident, change in _markup_as_written(boundary, ran, constructs, undo_from):
        candidates.append(((constructs[ident],), change))
    # Last, outputs not printed at all.
    candidates += [(group, UndoTemplate(undo_from, frozenset(c.id for c in group), base=boundary))
                   for group in groups if group[0].kind == "output"]
    lines = renderer.source_lines()
    trials = []
    for group, change in path:
        if _acts_after(change, runs_in_trace, agreed, boundary):
            continue
        trial = _trial(rerun, change, boundary)
        if trial is not None and trial.common > boundary.string_prefix.common:
            trials.append((trial, group, change))
    holding = 0
    for group, change in candidates[:MAX_TEMPLATE_CANDIDATES]:
        if _acts_after(change, runs_in_trace, agreed, boundary):
            continue
        trial = _trial(rerun, change, boundary)
        if trial is not None and trial.common > boundary.string_prefix.common:
            trials.append((trial, group, change))
            holding += trial.holds
            # Enough that keep the prefix to choose the smallest from; a transform of the model's text (tried first)
            # that keeps it is the cause.
            if holding >= HOLDING_ENOUGH or (trial.holds and not change.substitute and (
                    group[0].kind == "op" or (reasoning_lost and group[0].kind == "condition"))):
                break
    if not trials:
        return None
    # Texts bound upstream (a `set`, an assignment of the encoder) that hold the break.
    at = boundary.string_prefix.common
    bound = [value for ident, runs in ran.items() if constructs[ident].kind == "set"
             for value in _printed(constructs[ident], runs)
             if len(value) > 1 and _covering([value], boundary.next_prompt.text, at) is not None]

    def rank(item: tuple) -> tuple:
        trial, group, change = item
        head = group[0]
        distance = min(abs(c.line - emit_line) for c in group)
        # A construct that transforms the model's text (or a number that is not its message's index), then a binding
        # or op printing it anew (the furthest upstream first), then markup printed in place of what the model wrote,
        # then a branch taken, then an output left out.
        priority = {"op": 0.0, "set": 1.0, "condition": 3.0, "output": 4.0}[head.kind]
        if head.kind == "set" and not _substitutes_text(change):
            priority = 0.5
        elif head.kind == "set":
            if any(_builds_markup(printed, boundary) for _, printed, _ in change.substitute):
                # A binding that builds the template's markup around the model's text: after a branch that holds,
                # before an output it only passes through.
                priority = 3.4
            elif all(written.endswith(printed) and len(written) > len(printed)
                     for _, printed, written in change.substitute) and not _model_field_at(boundary):
                priority = 5.0  # text put before the value, outside what the model wrote: not the value's
        elif change.substitute:
            priority = 1.0 if head.kind == "op" or head.receiver else 2.0
            if priority == 2.0 and any(value in printed for _, printed, _ in change.substitute for value in bound):
                # The markup at the break was built upstream (a binding holds it) and only passes through this output
                # (a whole message's): after a branch that holds.
                priority = 3.5
            if all(written.endswith(printed) and len(written) > len(printed)
                   for _, printed, written in change.substitute):
                # Only text put before a value that starts at the break: the output before it ended early.
                priority = 5.0
        # Along the value's path the upstream construct comes first; elsewhere the nearest the emitting line.
        where = order.get(head.id, len(evaluations)) if priority in (0.5, 1.0) else distance
        # Holding first; among those the smallest change to the next prompt, then the construct class, the place.
        return (not trial.holds, trial.change_size if trial.holds else -trial.common, priority, where)

    ranked = sorted(trials, key=rank)
    best = ranked[0]
    if best[2].substitute and best[1][0].kind == "output":
        # Markup printed in place of the model's text is the weakest explanation: a filter or method that changed
        # the model's text at the break (undone, the break moves on) is the construct; so is a condition that chose
        # the branch printing that markup, when undoing it holds as well.
        line = best[1][0].line
        transforms = [t for t in trials if t[1][0].kind == "op" and not t[2].substitute
                      and any(r.message == target and r.before != r.after for c in t[1] for r in ran.get(c.id, ()))]
        branches = [t for t in ranked if t[0].holds and t[1][0].kind == "condition" and not t[2].substitute
                    and t[1][0].line <= line <= t[1][0].end_line and t[0].change_size <= best[0].change_size]
        # (Only where the break is inside a field the model wrote: its whitespace-only content around the markup
        # is the template's to format.)
        if transforms and (_inside_reasoning(boundary) or _model_field_at(boundary)):
            best = max(transforms, key=lambda t: (t[0].holds, t[0].common))
        elif branches:
            best = branches[0]
    trial, group, change = best
    # The construct that ran for the broken message heads a group; a group spread over the file (conditions on one
    # switch) is that construct, then the others as further locations.
    head = next((c for c in group if any(e.message == target for e in ran.get(c.id, ()))), group[0])
    close = [c for c in group if abs(c.line - head.line) <= 5]
    first, last = min(c.line for c in close), max(c.end_line for c in close)
    text = head.description if head.kind != "condition" else f"{head.description} (line {head.line})"
    source = lines[head.line - 1].strip() if 0 < head.line <= len(lines) else ""
    origin, path_name = boundary.next_prompt.origin, boundary.next_prompt.source_path
    location = Location(origin, path_name, first, last if last != first else None, text=text or source)
    pairs = [(value, written) for _, value, written in change.substitute
             if isinstance(value, str) and isinstance(written, str)]
    if head.kind == "set":
        how = (f"{head.description} assigning the model's own text for {len(pairs)} value(s)" if pairs else
               f"{head.description} assigning {_index_words(change)}")
        # A binding that builds markup around the model's text changed the template's scaffolding, not the text.
        name = "markup" if any(_builds_markup(value, boundary) for value, _ in pairs) else head.name
        return _Counterfactual(trial, (location,), f"set:{name}", how, _whitespace_change(pairs), change)
    if head.kind == "output" and change.substitute:
        # A variable printed here was computed by a `set` above: that assignment is the construct; the one that ran
        # last before this output for the broken message, where the bindings were recorded.
        printed_at = order.get(head.id, len(evaluations))
        assigned = [constructs[e.construct] for e in evaluations[:printed_at]
                    if e.message == target and constructs[e.construct].kind == "set"
                    and constructs[e.construct].receiver in head.names]
        if assigned:
            binding = assigned[-1]
            binding_location = Location(origin, path_name, binding.line,
                                        binding.end_line if binding.end_line != binding.line else None,
                                        text=binding.description)
            name = "markup" if any(_builds_markup(value, boundary) for value, _ in pairs) else "set"
            return _Counterfactual(trial, (binding_location, location), f"set:{name}",
                                   f"{head.description} printing the model's own text", _whitespace_change(pairs),
                                   change)
        set_lines = [line for name in head.names for line in table.assigned_at.get(name, ()) if line <= head.line]
        if set_lines:
            line = max(set_lines)
            set_text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            return _Counterfactual(trial, (Location(origin, path_name, line, text=set_text), location), "op:set",
                                   f"{head.description} printing the model's own text", _whitespace_change(pairs),
                                   change)
    others = tuple(Location(origin, path_name, c.line, c.end_line if c.end_line != c.line else None,
                            text=c.description)
                   for c in group if c not in close)
    scope = "everywhere" if change.message == -1 else "from the broken message on"
    how = (f"{location.text} printing the model's own text for {len(change.substitute)} value(s)"
           if change.substitute else " and ".join(c.description for c in group) + f" undone {scope}")
    changes_seen = [(r.before, r.after) for c in group for r in ran.get(c.id, ())
                    if isinstance(r.before, str) and isinstance(r.after, str) and r.before != r.after]
    return _Counterfactual(trial, (location, *others), f"{head.kind}:{head.name}", how,
                           _whitespace_change(changes_seen), change)


def _acts_after(change: UndoTemplate, runs: dict[int, list[tuple[int, int | None]]], agreed: int,
                boundary: Boundary) -> bool:
    """Whether `change` cannot move the break, known from the trace without rendering it: the first run it changes
    comes after the render had put out more than the `agreed` characters the traced prompt shares with the previous
    sequence (Evaluation.emitted). The counterfactual prompt is the traced one up to there, so it breaks where the
    traced one does, at `agreed`, which is not past the break. False where the trace does not count its output.
    `runs`: each construct's runs in the trace, in order, as (message, emitted)."""
    if agreed > boundary.string_prefix.common:
        return False  # the traced prompt is not the next prompt (the bridge's): the re-run says
    first = None
    for ident in change.constructs | {ident for ident, _, _ in change.substitute}:
        # The count only grows: a construct's first run that the change reaches is its earliest.
        emitted = next((emitted for message, emitted in runs.get(ident, ())
                        if change.message == -1 or message >= change.message), agreed + 1)
        if emitted is None:
            return False
        first = emitted if first is None else min(first, emitted)
    return first is None or first > agreed


def _runs_by_construct(evaluations: list) -> dict[int, list[tuple[int, int | None]]]:
    runs: dict[int, list[tuple[int, int | None]]] = {}
    for evaluation in evaluations:
        runs.setdefault(evaluation.construct, []).append((evaluation.message, evaluation.emitted))
    return runs


def _builds_markup(value: str, boundary: Boundary) -> bool:
    """Whether a bound text holds markup of the template's besides the model's own text (`<｜DSML｜parameter
    name="city" string="true">Paris</｜DSML｜parameter>`, not `Paris`)."""
    rest = value
    for text in sorted(_model_texts(boundary), key=len, reverse=True):
        if text:
            rest = rest.replace(text, "")
    return any(mark in rest for mark in "<>[]|")


def _model_texts(boundary: Boundary) -> list[str]:
    """The model's fields as the engine returned them: reasoning, content, and each argument's value."""
    texts = [boundary.parse.reasoning or "", boundary.parse.content or ""]
    for call in boundary.parse.tool_calls:
        arguments = _json_or_none(call.arguments)
        if isinstance(arguments, dict):
            texts += [value if isinstance(value, str) else json.dumps(value) for value in arguments.values()]
        texts.append(call.name or "")
    return texts


def _substitutes_text(change: UndoTemplate) -> bool:
    return any(isinstance(written, str) for _, _, written in change.substitute)


def _index_words(change: UndoTemplate) -> str:
    """"3 instead of 4, …" for a binding's numbers substituted by their messages' indices."""
    def number(key: object) -> str:
        return str(key).rpartition(":")[2]

    return ", ".join(f"{index} instead of {number(key)}" for _, key, index in change.substitute[:3]) + (
        " (the index of the message it was computed for)")


def _index_bindings(evaluations: list, constructs) -> list[tuple[int, UndoTemplate]]:
    """Bindings of a number computed while the template rendered a message, one or two off that message's own index
    (its place in the conversation, or in the list the loop runs over: `loop.index0`): had each been that index. An
    index off by one in a loop over the messages (`set ns.last_user_index = loop.index0 + 1`) drops a turn's
    reasoning at a condition far below; the binding is the construct, the condition only reads it."""
    by_target: dict[tuple[int, str], dict[str, int]] = {}
    conflicting: set[tuple[int, str]] = set()
    for evaluation in evaluations:
        construct = constructs[evaluation.construct]
        value = evaluation.before
        if construct.kind != "set" or evaluation.message < 0 or type(value) is not int:
            continue
        for what, index in (("message", evaluation.message), ("loop", evaluation.after)):
            if type(index) is not int or not 0 < abs(index - value) <= 2:
                continue
            key = (construct.id, what)
            mapping = by_target.setdefault(key, {})
            value_key = substitution_key(value)
            if mapping.get(value_key, index) != index:
                conflicting.add(key)
            mapping[value_key] = index
    return [(ident, UndoTemplate(-1, substitute=tuple((ident, k, v) for k, v in mapping.items())))
            for (ident, what), mapping in by_target.items() if (ident, what) not in conflicting]


def _emptied_bindings(boundary: Boundary, ran: dict[int, list], constructs, undo_from: int, emit_line: int,
                      target: int) -> list[tuple[int, UndoTemplate]]:
    """Where the next prompt lacks exactly one field the model wrote (its reasoning, its content) and goes on as the
    previous sequence does after it: each binding, and each printed variable on the emitting line, that held "" for
    the broken message, had it held that field instead."""
    prev, nxt, at = boundary.prev_text, boundary.next_prompt.text, boundary.string_prefix.common
    aligned = _alignment(prev, nxt, at)
    if aligned is None or aligned != (0, aligned[1]) or aligned[1] == 0:
        return []
    written = prev[at:at + aligned[1]]
    if not any(written.strip() and written.strip() == value.strip() for value in _field_text(boundary).values()):
        return []
    found = []
    for ident, runs in ran.items():
        construct = constructs[ident]
        empty = any(r.message == target and r.before == "" for r in runs)
        if empty and (construct.kind == "set" or (construct.kind == "output" and construct.receiver
                                                  and construct.line == emit_line)):
            found.append((ident, UndoTemplate(undo_from, substitute=((ident, "", written),), base=boundary)))
    return found


@functools.lru_cache(maxsize=64)  # asked several times for one break (emitting line, bindings, opening)
def _alignment(prev: str, nxt: str, at: int, width: int = 24) -> tuple[int, int] | None:
    """(d, e) with the smallest d + e such that the next prompt after its d characters from the break, and the previous
    sequence after its e characters from the break, agree again (for `width` characters, or to the previous
    sequence's end): d characters the next prompt has there instead of e the previous sequence has."""
    best: tuple[int, int] | None = None
    for d in range(0, 65):
        if best is not None and d >= sum(best):
            break
        piece = nxt[at + d:at + d + width]
        if not piece:
            break
        e = prev.find(piece, at, at + 4000 + width) - at if len(piece) == width else -1
        if e < 0:  # the previous sequence ends within `width`: its tail must start the next prompt's rest
            e = next((e for e in range(max(0, len(prev) - at - width + 1), len(prev) - at)
                      if nxt.startswith(prev[at + e:], at + d)), -1)
        if e >= 0 and (best is None or d + e < sum(best)):
            best = (d, e)
    return best


def _covering(results: list[str], text: str, at: int, ending: bool = False) -> tuple[str, int] | None:
    """A printed result whose occurrence in `text` holds character `at` (or, `ending`, ends right before it), with
    that occurrence's start."""
    for result in results:
        start = text.find(result, max(0, at - len(result) + (0 if ending else 1)))
        if 0 <= start <= at < start + len(result) + ending:
            return result, start
    return None


def _cut_from_field(boundary: Boundary) -> bool:
    """Whether the next prompt only lacks, at the break, characters of a field the model wrote (a value assigned
    with its end cut off then ends right before the break)."""
    aligned = _alignment(boundary.prev_text, boundary.next_prompt.text, boundary.string_prefix.common)
    return aligned is not None and aligned[0] == 0 and aligned[1] > 0 and _model_field_at(boundary)


def _printed(construct, runs: list) -> list[str]:
    """What an op returned, or an output of a variable printed, where it differs from its input; what a binding
    assigned."""
    if construct.kind == "set":
        return [r.before for r in runs if isinstance(r.before, str) and r.before]
    if construct.kind == "op":
        return [r.after for r in runs if isinstance(r.after, str) and len(r.after) > 1 and r.before != r.after]
    if construct.kind == "output" and construct.receiver:  # a bare variable, not markup
        return [r.before for r in runs if isinstance(r.before, str) and len(r.before) > 1]
    return []


def _reprinting_ops(boundary: Boundary, ran: dict[int, list], constructs) -> list[int]:
    """Ops (and outputs of variables) whose printed result holds the first differing character of the next prompt."""
    at = boundary.string_prefix.common
    cut = _cut_from_field(boundary)
    return [ident for ident, runs in ran.items()
            if _covering(_printed(constructs[ident], runs), boundary.next_prompt.text, at,
                         ending=cut and constructs[ident].kind == "set") is not None]


def _written_in_place(prev: str, nxt: str, start: int, printed: str, at: int) -> str | None:
    """What the model wrote where the next prompt printed `printed` (at `start`, holding or ending at the break `at`):
    prev[start:end], for the end after which the previous sequence goes on as the next prompt does after `printed`."""
    after = nxt[start + len(printed):start + len(printed) + 40]
    best_end, best = None, -1
    for end in range(at, min(len(prev), at + len(printed) + 8) + 1):
        score = common_prefix(prev[end:end + 40], after) if after else 0
        if after and end < len(prev) and score == min(40, len(prev) - end, len(after)):
            # The previous sequence goes on exactly as the next prompt does (to its end, where the model stopped).
            return prev[start:end]
        if score > best:
            best_end, best = end, score
    # Else the end with the longest agreement; a few characters that happen to agree (`<|im` of `<|im_end|>` and
    # `<|im_start|>`) count for less than the model's text running out (what it wrote last is all it wrote there).
    if best_end is None or best < 8:
        return prev[start:] if len(prev) <= at + len(printed) + 8 else (
            prev[start:best_end] if best_end is not None and best > 0 else None)
    return prev[start:best_end]


def _markup_as_written(boundary: Boundary, ran: dict[int, list], constructs, undo_from: int
                       ) -> list[tuple[int, UndoTemplate]]:
    """Outputs of the template's own markup at the break (holding its first differing character, or ending right
    before it), each printing instead what the model wrote there, when the two differ by a few characters only."""
    prev, nxt = boundary.prev_text, boundary.next_prompt.text
    at = boundary.string_prefix.common
    found: list[tuple[int, UndoTemplate]] = []
    for ident, runs in ran.items():
        construct = constructs[ident]
        if construct.kind != "output" or construct.receiver:
            continue
        for run in runs:
            value = run.before
            if not isinstance(value, str) or not value:
                continue
            starts = [start for start in (nxt.find(value, max(0, at - len(value) + 1)), at - len(value))
                      if 0 <= start <= at and nxt.startswith(value, start)]
            if not starts:
                continue
            written = _written_in_place(prev, nxt, starts[0], value, at)
            if written is None or _change_size(value, written) > 16:
                continue
            found.append((ident, UndoTemplate(undo_from, substitute=((ident, value, written),), base=boundary)))
            break
    return found


def _reprinted_as_written(boundary: Boundary, rerun: Rerun, ran: dict[int, list], constructs, ident: int,
                          undo_from: int, rounds: int = 8) -> UndoTemplate | None:
    """Substitute, value by value, the model's own text for what the op printed (from the break to where the two
    sequences agree again), as long as each substitution moves the break on."""
    results = _printed(constructs[ident], ran[ident])
    prev = boundary.prev_text
    substitute: dict[object, str] = {}
    current, change = boundary, None
    for _ in range(rounds):
        at = current.string_prefix.common
        covered = _covering([r for r in results if r not in substitute], current.next_prompt.text, at,
                            ending=constructs[ident].kind == "set" and _cut_from_field(current))
        if covered is None:
            break
        result, start = covered
        written = _written_in_place(prev, current.next_prompt.text, start, result, at)
        if written is None:
            break
        substitute[result] = written
        attempt = UndoTemplate(undo_from, substitute=tuple((ident, r, t) for r, t in substitute.items()),
                               base=boundary)
        moved = rerun(attempt)
        if moved is None or moved.string_prefix.common <= at:
            break
        current, change = moved, attempt
        if moved.string_prefix.holds:
            break
    return change


def _candidate_groups(constructs, ran: dict[int, list], emit_line: int) -> list[tuple]:
    """Constructs that ran for the broken messages, as undo groups, nearest the emitting line first: ops that changed
    a value, then conditions, then outputs. An op is undone together with the same operation on the same expression
    a few lines around it (`{% if content.strip() %}{{ content.strip() }}` is one construct)."""
    ops: list[tuple] = []
    conditions, outputs = [], []
    for ident, runs in ran.items():
        construct = constructs[ident]
        if construct.kind == "op":
            if any(r.before != r.after for r in runs):
                twins = tuple(c for c in constructs if c.kind == "op" and c.name == construct.name
                              and c.receiver == construct.receiver and abs(c.line - construct.line) <= 3)
                if twins not in ops:
                    ops.append(twins)
        elif construct.kind == "condition":
            conditions.append((construct,))
        elif construct.kind == "output" and any(r.before not in ("", None) for r in runs):
            outputs.append((construct,))

    def distance(group: tuple) -> tuple[int, int]:
        return (min(abs(c.line - emit_line) for c in group), group[0].line)

    return [*sorted(ops, key=distance), *sorted(conditions, key=distance), *sorted(outputs, key=distance)]


def _switch_groups(constructs, ran: set[int], switches: frozenset[str], aliases: dict[str, frozenset[str]]
                   ) -> list[tuple]:
    """For each template switch tested by conditions that ran, those conditions (a condition on a
    variable set from the switch, like `effective_drop_thinking = drop_thinking`, tests the switch too)."""
    from engine.render.constructs import derived_names

    reach = {switch: derived_names(frozenset({switch}), aliases) for switch in switches}
    on_switch: dict[str, list] = {}
    for ident in sorted(ran):
        construct = constructs[ident]
        if construct.kind == "condition":
            for switch, names in reach.items():
                if construct.names & names:
                    on_switch.setdefault(switch, []).append(construct)
    return [tuple(group) for _, group in sorted(on_switch.items())]


def _field_text(boundary: Boundary) -> dict[str, str]:
    parse = boundary.parse
    fields = {"reasoning": parse.reasoning or "", "content": parse.content or ""}
    for i, call in enumerate(parse.tool_calls):
        fields[f"call {i + 1} arguments"] = call.arguments
    return fields


def _template_kind(boundary: Boundary, construct_kind: str, whitespace_change: str,
                   written: ParseResult | None) -> str:
    """The kind of a template cause, from the construct (`op:trim`, `condition:if`, `output:output`) and what it did:
    `whitespace_change` says the op's input and output differ only in whitespace ("trim", "normalise")."""
    prev, nxt = boundary.prev_text, boundary.next_prompt.text
    at = boundary.string_prefix.common
    kind, _, name = construct_kind.partition(":")
    reasoning_lost = _reasoning_lost_at_break(boundary)
    if reasoning_lost and (kind in ("condition", "output", "set") or name in ("split", "rsplit")):
        return "reasoning-dropped"
    if (boundary.completion.truncated and at >= len(prev) - 1) or _close_inserted(prev, nxt, at):
        return "close-inserted"
    if _call_id_at_break(boundary, written):
        return "call-id-renumbered"
    a, b = prev[at:at + 1], nxt[at:at + 1]
    whitespace_at_break = (a.isspace() or not a) or (b.isspace() or not b)
    if kind == "op" or (kind == "set" and name != "markup"):
        if name in ("tojson", "string") or "json" in name:
            return "args-reserialised"
        if whitespace_change == "trim" and _inside_reasoning(boundary):
            return "reasoning-trimmed"
        if whitespace_change:
            return "whitespace-normalised"
        if name in ("split", "rsplit"):
            return "content-dropped"
        return "text-rewritten"
    if _in_arguments(boundary):
        return "args-reserialised"
    if kind == "condition" and _model_field_at(boundary):
        return "whitespace-normalised" if whitespace_at_break else "content-dropped"
    return "scaffold-changed"


def _whitespace_change(pairs: list[tuple[str, str]]) -> str:
    """"trim" when each (before, after) differs only by whitespace at the ends, "normalise" when only by whitespace,
    else ""."""
    if not pairs or any(re.sub(r"\s+", "", a) != re.sub(r"\s+", "", b) for a, b in pairs):
        return ""
    trimmed = all(a.strip() == b.strip() and (a.strip() in (a, b) or b.strip() in (a, b) or
                                              a.lstrip() in (a, b) or a.rstrip() in (a, b)) for a, b in pairs)
    return "trim" if trimmed else "normalise"


def _call_id_at_break(boundary: Boundary, written: ParseResult | None) -> bool:
    """Whether the model's own tool-call id is at the break in the previous sequence."""
    at = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    text = boundary.completion.text
    for call in written.tool_calls if written is not None else ():
        if call.id:
            start = text.find(call.id)
            if start >= 0 and start <= at < start + len(call.id):
                return True
    return False


def _reasoning_lost_at_break(boundary: Boundary) -> bool:
    """Whether the previous sequence has a turn's reasoning at the break that the next prompt does not have at all."""
    prev, nxt = boundary.prev_text, boundary.next_prompt.text
    at = boundary.string_prefix.common
    texts = [boundary.parse.reasoning or ""]
    if boundary.next_request is not None:
        texts += [m.get(key) or "" for m in boundary.next_request.messages if m.get("role") == "assistant"
                  for key in ("reasoning_content", "reasoning", "thinking") if isinstance(m.get(key), str)]
    for text in texts:
        text = text.strip()
        if len(text) < 8:
            continue
        start = prev.find(text, max(0, at - len(text) - 16))
        # Lost, not rewritten: not even its middle half is in the next prompt (a reasoning with a character cut off
        # or changed is there, rewritten).
        middle = text[len(text) // 4:len(text) - len(text) // 4]
        if 0 <= start <= at + 40 and middle not in nxt:
            return True
    return False


CLOSE_TAGS = ("</think>", "<|end|>", "<|im_end|>", "<|return|>", "<|call|>", "</tool_call>",
              "<|tool_calls_section_end|>", "<｜end▁of▁sentence｜>")


def _close_inserted(prev: str, nxt: str, at: int) -> bool:
    """The next prompt has a close tag at the break (its first characters may be common) that the model did not write
    there or just after."""
    for tag in CLOSE_TAGS:
        for start in range(max(0, at - len(tag) + 1), at + 1):
            if nxt.startswith(tag, start) and tag not in prev[start:start + len(tag) + 8]:
                return True
    return False


def _inside_reasoning(boundary: Boundary) -> bool:
    at = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    reasoning = boundary.parse.reasoning or ""
    text = boundary.completion.text
    start = text.find(reasoning) if reasoning else -1
    return start >= 0 and start - 2 <= at <= start + len(reasoning) + 2


ARGUMENT_OPENS = ("<|tool_call_argument_begin|>", "<parameter=", "<arg_key>", "parameter name=", "json<|message|>")
CALL_CLOSES = ("</tool_call>", "<|tool_call_end|>", "</｜DSML｜invoke>", "<|call|>", "</invoke>")


def _in_arguments(boundary: Boundary) -> bool:
    """Whether the break is inside the arguments of a tool call the model wrote (after they opened, before the call
    closed)."""
    at = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    if at < 0:
        return False
    tail = boundary.completion.text[:at]
    opened = max(tail.rfind(marker) for marker in ARGUMENT_OPENS)
    closed = max(tail.rfind(marker) for marker in CALL_CLOSES)
    return opened >= 0 and opened > closed


def _model_field_at(boundary: Boundary) -> bool:
    """Whether the model's own field text (not its markup) is at the break in the previous sequence."""
    at = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    if at < 0:
        return False
    text = boundary.completion.text
    for value in _field_text(boundary).values():
        start = text.find(value) if value.strip() else -1
        if start >= 0 and start <= at < start + len(value):
            return True
    return False


def _changed_in_template(boundary: Boundary) -> str:
    at = boundary.string_prefix.common
    prev, nxt = boundary.prev_text, boundary.next_prompt.text
    if at < len(boundary.prev_prompt.text):
        return (f"the next prompt re-renders the previous prompt differently at character {at}: "
                f"{_snippet(prev, at)!r} became {_snippet(nxt, at)!r}")
    return f"the model wrote {_snippet(prev, at)!r}; the next prompt has {_snippet(nxt, at)!r}"


# -- fix hints ---------------------------------------------------------------------------------------------------


def _fix_hint(boundary: Boundary, context: BlameContext, rerun: Rerun, cause: Cause) -> Fix:
    """The first fix, in the order a practitioner would apply them, that a re-run proves: a template switch that keeps
    the prompt the model answered, the client setting, another version of the same engine, the bridge, and only when
    even the bridge does not hold a switch that changes what the model is asked to do (said so). A switch counts when
    it makes the boundary hold, or else when it removes this break (the boundary then breaks later, for another
    cause): the same cause gets the same hint on every engine."""
    model = context.model
    keeping: list[tuple[bool, int, Fix]] = []  # (does not hold, order, fix): the first that holds wins
    changing: list[tuple[bool, int, Fix]] = []
    deferred: list[tuple[str, bool]] = []
    for kwarg in model.spec.template_kwargs:
        if not isinstance(kwarg.default, bool):
            continue
        value = not context.kwargs.get(kwarg.name, kwarg.default)
        if kwarg.name in context.user_kwargs and context.user_kwargs[kwarg.name] == value:
            continue
        if _answered_prompt_changes(boundary, context, {kwarg.name: value}):
            # It changes what the model is asked: offered only when even the bridge does not hold, so its re-run
            # waits until then.
            deferred.append((kwarg.name, value))
            continue
        found = _kwarg_fix(boundary, rerun, kwarg.name, value)
        if found is not None:
            fix, holds = found
            (changing if fix.changes_behaviour else keeping).append((not holds, len(keeping) + len(changing), fix))
    if keeping:
        return min(keeping)[2]
    if cause.stage == "client":
        setting = next(iter(context.scenario.client))
        return Fix("client", f"send the assistant turn back whole ({setting}="
                             f"{str(CLIENT_SETTINGS[setting]).lower()})", setting=setting,
                   value=CLIENT_SETTINGS[setting], proof=cause.proof)
    for other in _same_engine_versions(context):
        fixed = rerun(WithEngine(other))
        if fixed is not None and fixed.holds:
            return Fix("engine", f"serve with {other}", engine=str(other),
                       proof=f"re-run with {other}: the boundary holds")
    bridged = rerun(WithEngine(EngineSpec("bridge")))
    bridge = Fix("bridge", "build the next prompt by appending to the previous token ids (bridge) instead of "
                           "re-rendering", engine="bridge", proof="re-run with the bridge: the boundary holds")
    if bridged is not None and bridged.holds:
        return bridge
    for name, value in deferred:
        found = _kwarg_fix(boundary, rerun, name, value, keeps=False)
        if found is not None:
            changing.append((not found[1], len(changing), found[0]))
    if changing:
        return min(changing)[2]
    return replace(bridge, proof="re-run with the bridge: the next prompt's new messages do not render, so even the "
                                 "bridge does not hold")


def _kwarg_fix(boundary: Boundary, rerun: Rerun, name: str, value: bool, keeps: bool | None = None
               ) -> tuple[Fix, bool] | None:
    """The fix of flipping one kwarg, and whether the boundary then holds; None when the flip does not remove this
    break. `keeps`: whether the prompt the model answered stays the same (None: as the re-run shows)."""
    fixed = rerun(WithKwargs({name: value}))
    if fixed is None or not (fixed.holds or fixed.string_prefix.common > boundary.string_prefix.common):
        return None
    setting = f"{name}={'true' if value else 'false'}"
    outcome = "the boundary holds" if fixed.holds else (
        f"this break goes away; the boundary breaks later, at character {fixed.string_prefix.common}")
    # A flip that changes the prompt the model answered (e.g. reasoning turned off) changes its behaviour, not only
    # how its text comes back.
    if keeps is None:
        keeps = fixed.prev_prompt.text == boundary.prev_prompt.text
    fix = Fix("kwarg", f"set {setting}" if keeps else
              f"set {setting} (this changes what the model is asked to do: nothing that keeps its text fixes the cell)",
              kwarg=name, value=value,
              proof=f"re-run with {setting}: {outcome}; the prompt the model answered "
                    f"{'is unchanged' if keeps else 'changes'}", changes_behaviour=not keeps)
    return fix, fixed.holds


def _answered_prompt_changes(boundary: Boundary, context: BlameContext, kwargs: dict[str, Any]) -> bool:
    """Whether other kwargs change the prompt the model answered: that prompt rendered again with them (the next
    request's messages before the model's turn), without re-running the cell."""
    from engine.errors import RenderError

    request = boundary.next_request
    turns = [i for i, m in enumerate(request.messages) if m.get("role") == "assistant"] if request else []
    if not turns:
        return False
    try:
        again = context.model.renderer.render(request.messages[:turns[-1]], request.tools,
                                              add_generation_prompt=True, kwargs={**request.kwargs, **kwargs})
    except RenderError:
        return False
    return again.text != boundary.prev_prompt.text


def _same_engine_versions(context: BlameContext) -> list[EngineSpec]:
    """Other versions of the cell's engine that serve this model with the same parser names."""
    if not context.engine.is_serving_engine:
        return []
    from engine.serving.registry import get_engine, list_engines

    current = get_engine(context.engine)
    parsers = context.model.spec.engine_parsers.get(current.name, {})
    others = []
    for spec in list_engines():
        other = get_engine(spec)
        if other.name != current.name or other.spec == current.spec:
            continue
        if parsers.get("reasoning_parser") and parsers["reasoning_parser"] not in other.reasoning_parsers:
            continue
        if parsers.get("tool_call_parser") and parsers["tool_call_parser"] not in other.tool_parsers:
            continue
        others.append(other.release_spec)
    return others
