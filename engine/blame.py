"""Cause attribution by counterfactual: the change to the model's text whose undo keeps the prefix.

A boundary breaks because something between the model's output and the next prompt changed what the model wrote.
Blame lists the candidate changes, undoes each alone through a re-run function the simulator hands in (blame never
runs the simulator itself), and names the one whose undo makes the boundary hold, or moves the break furthest:
  - engine: each parser or request-side edit (text edits, and what is not a text edit: a lost call, a renumbered id,
    null for ""), undone in the engine's result or request;
  - client: the scenario's client setting, replaced by a client that echoes everything;
  - template: each construct the template ran for the message whose rendering broke (a filter or string method on
    its fields, a condition, an output), undone for that message only (engine.render.constructs).
The construct is the primary location; the line that emitted the differing character comes second. A break that
no undo moves is blamed on the emitting construct, and the proof says that nothing else moved it.
Fix hints are re-run too, and ranked: a switch that keeps the model's text before one that changes what the model is
asked to do (turning reasoning off), other versions of the same engine, then the append-only bridge.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.models import LoadedModel
from engine.scenario import CLIENT_SETTINGS, SCENARIOS_DIR, Scenario
from engine.types import (
    Boundary,
    Cause,
    Change,
    EchoingClient,
    Edit,
    Fix,
    Location,
    ParseResult,
    UndoRequestEdit,
    UndoTemplate,
    UseParse,
    WithEngine,
    WithKwargs,
)

Rerun = Callable[[Change], Boundary | None]
MAX_TEMPLATE_CANDIDATES = 80  # constructs tried per break, nearest to the break first


@dataclass(frozen=True)
class BlameContext:
    model: LoadedModel
    scenario: Scenario
    engine: str  # as the cell was asked for: "raw", "bridge", "vllm", "sglang@0.5.12", ...
    user_kwargs: dict[str, Any]
    kwargs: dict[str, Any]  # the kwargs the cell rendered with (model defaults, scenario, user)


@dataclass(frozen=True)
class _Trial:
    """One undone change and what the re-run gave: the new common prefix (characters), and whether it holds."""

    common: int
    holds: bool


def _trial(rerun: Rerun, change: Change) -> _Trial | None:
    boundary = rerun(change)
    if boundary is None:
        return None
    return _Trial(boundary.string_prefix.common, boundary.string_prefix.holds)


def _prefix_words(boundary: Boundary, trial: _Trial) -> str:
    total = boundary.string_prefix.prev_len
    if trial.holds:
        return f"the boundary holds ({total}/{total} characters)"
    return f"the break moves from character {boundary.string_prefix.common} to {trial.common} of {total}"


def _snippet(text: str, at: int, width: int = 24) -> str:
    return text[at:at + width]


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


def _producing_edit(value: str, written: str, steps: tuple[Edit, ...], fallback: Edit) -> Edit:
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


def _field_differences(parse: ParseResult, written: ParseResult, origin: str) -> list[tuple[ParseResult, Edit,
                                                                                             str]]:
    """Each field where the engine's result differs from what the model wrote (the lossless split), with the field
    put back as written: the reasoning, the content, a call's arguments or id, the calls themselves, null for ""."""
    found: list[tuple[ParseResult, Edit, str]] = []
    where = Location(origin, "serving layer", 0)
    edits = parse.edits
    if len(parse.tool_calls) < len(written.tool_calls):
        kept = {call.name for call in parse.tool_calls}
        lost = [call.name for call in written.tool_calls if call.name not in kept] or [written.tool_calls[-1].name]
        # The step that cut the lost call's markup out of the text.
        edit = next((e for e in edits if lost[0] in e.before and lost[0] not in e.after), None) or Edit(
            "call_lost", f"{len(written.tool_calls)} tool calls", f"{len(parse.tool_calls)} tool calls", where,
            "the engine returned fewer tool calls than the model wrote")
        found.append((replace(parse, tool_calls=written.tool_calls), edit, "calls"))
    for i, (call, own) in enumerate(zip(parse.tool_calls, written.tool_calls)):
        if _json_or_none(call.arguments) != _json_or_none(own.arguments) or (
                _json_or_none(own.arguments) is None and call.arguments != own.arguments):
            calls = list(parse.tool_calls)
            calls[i] = replace(call, arguments=own.arguments)
            edit = _producing_edit(call.arguments, own.arguments, edits, Edit(
                "args_rewritten", own.arguments, call.arguments, where, "the arguments are not the model's"))
            found.append((replace(parse, tool_calls=tuple(calls)), replace(edit, before=own.arguments,
                                                                           after=call.arguments), "arguments"))
        if own.id and call.id != own.id:
            calls = list(parse.tool_calls)
            calls[i] = replace(call, id=own.id)
            edit = next((e for e in edits if e.before == own.id and e.after == call.id), None) or Edit(
                "call_id_replaced", own.id, call.id or "", where, "the tool-call id the model wrote is replaced")
            found.append((replace(parse, tool_calls=tuple(calls)), edit, "id"))
    for field in ("reasoning", "content"):
        value, own = getattr(parse, field), getattr(written, field)
        if value == own or (not value and not own and field == "reasoning"):
            continue
        if field == "content" and value is None and own == "":
            edit = Edit("content_null", '""', "null", where, "an empty answer is returned as null")
        else:
            edit = _producing_edit(value or "", own or "", edits, Edit(
                f"{field}_rewritten", own or "", value or "", where, f"the {field} is not the model's"))
            edit = replace(edit, before=own or "", after=value or "")
        found.append((replace(parse, **{field: own if own is not None else ""}), edit, field))
    return found


def _engine_candidates(boundary: Boundary, context: BlameContext) -> list[_EngineCandidate]:
    parse = boundary.parse
    written = _written_fields(boundary, context)
    candidates: list[_EngineCandidate] = []
    for edit in parse.edits:
        undone = _with_edit_undone(parse, edit, written, boundary.completion.text) if written is not None else None
        if undone is not None:
            candidates.append(_EngineCandidate(UseParse(undone[0]), edit, undone[1], len(candidates)))
    if written is not None:
        origin = parse.edits[0].location.origin if parse.edits else context.engine
        for result, edit, field in _field_differences(parse, written, origin):
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


def _engine_kind(candidate: _EngineCandidate) -> str:
    edit, field = candidate.edit, candidate.field
    if field == "calls":
        return "call-lost"
    if field == "id":
        return "call-id-renumbered"
    if edit.step == "content_null":
        return "content-null"
    if field in ("arguments", "request") and (edit.before.lstrip().startswith("{") or edit.after.startswith("{")):
        return _arguments_kind(edit.before, edit.after)
    if field == "arguments":
        return "args-reserialised"
    if field == "request":
        return "reasoning-dropped" if "reasoning" in edit.before else "args-reserialised"
    if edit.before.strip() == edit.after.strip():
        return "reasoning-trimmed" if field == "reasoning" else "whitespace-normalised"
    if field == "reasoning":
        return "reasoning-dropped"
    return "content-dropped"


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
    if context.engine in ("raw", "bridge"):
        return None
    candidates = _engine_candidates(boundary, context)
    best: tuple[_Trial, _EngineCandidate] | None = None
    for candidate in candidates:
        trial = _trial(rerun, candidate.change)
        if trial is None or trial.common <= boundary.string_prefix.common:
            continue
        if best is None or (trial.holds, trial.common) > (best[0].holds, best[0].common):
            best = (trial, candidate)
        if trial.holds:
            break
    if best is None:
        return None
    trial, candidate = best
    edit = candidate.edit
    kind = _engine_kind(candidate)
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
    """The scenario's client setting is the cause when the same cell with a client that echoes everything holds."""
    scenario = context.scenario
    if not scenario.client:
        return None
    trial = _trial(rerun, EchoingClient())
    if trial is None or not trial.holds:
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
    # something out): the line that emitted that chunk.
    if 0 < pos < len(rendered.text) and rendered.source_line[pos] != rendered.source_line[pos - 1]:
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
    if context.engine not in ("raw", "bridge"):
        # The template's constructs act on what the engine handed over; had the engine kept the model's fields, would
        # the template still break here? Then blame the template on that request (the same cause as the raw column).
        written = _written_fields(boundary, context)
        again = rerun(UseParse(written)) if written is not None else None
        if again is not None and not again.string_prefix.holds and \
                again.string_prefix.common == boundary.string_prefix.common:
            base = again
    found = _template_counterfactual(base, context, rerun, emit_line)
    if found is not None:
        trial, found_locations, construct_kind, how = found
        location = found_locations[0]
        kind = _template_kind(boundary, construct_kind, location)
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
    kind = _template_kind(boundary, "output", emit_location)
    return Cause(
        stage="template", kind=kind, locations=(emit_location,), changed=changed, fix=None,
        proof="no construct of the template that ran for this message, undone alone, moves the break: the first "
              "differing character is this line's own output",
        detail=f"at char {at}: previous {_snippet(boundary.prev_text, at)!r} vs next {_snippet(rendered.text, at)!r}; "
               f"emitted by: {emit_location.text}",
    )


def _same_place(a: Location, b: Location) -> bool:
    return a.path == b.path and a.line <= b.line <= (a.end_line or a.line)


def _template_counterfactual(boundary: Boundary, context: BlameContext, rerun: Rerun, emit_line: int
                             ) -> tuple[_Trial, tuple[Location, ...], str, str] | None:
    renderer = context.model.renderer
    constructs_of = getattr(renderer, "constructs", None)
    counterfactual = getattr(renderer, "render_counterfactual", None)
    if constructs_of is None or counterfactual is None or boundary.next_request is None:
        return None
    target = _break_message(boundary)
    # From the message before the break's on: a turn's closing markup (the transition after a user message) is
    # emitted while that message renders. Undoing a construct there changes only what follows it in the next
    # prompt, since the previous prompt rendered it before the break.
    undo_from = max(target - 1, 0)
    try:
        _, evaluations = counterfactual(boundary.next_request)
    except Exception:  # noqa: BLE001 - the instrumented render is a second opinion; the emitting line stands
        return None
    constructs = constructs_of()
    ran: dict[int, list] = {}
    for evaluation in evaluations:
        if evaluation.message >= undo_from:
            ran.setdefault(evaluation.construct, []).append(evaluation)
    groups = _candidate_groups(constructs, ran, emit_line)
    changes = [UndoTemplate(undo_from, frozenset(c.id for c in group), base=boundary) for group in groups]
    # Last, every condition on one template switch (a kwarg such as drop_thinking tested in several places, also
    # outside any message, e.g. where the history is prepared), undone everywhere together.
    aliases = getattr(renderer, "construct_aliases", dict)()
    for group in _switch_groups(constructs, {e.construct for e in evaluations}, frozenset(context.kwargs), aliases):
        groups.append(group)
        changes.append(UndoTemplate(-1, frozenset(c.id for c in group), base=boundary))
    # An op that printed a value anew (`|tojson`, `to_json`): had it printed the model's own text for each value.
    for ident in _reprinting_ops(boundary, ran):
        change = _reprinted_as_written(boundary, rerun, ran, ident, undo_from)
        if change is None:
            continue
        at = next((i for i, g in enumerate(groups) if g and g[0].kind != "op"), len(groups))
        groups.insert(at, (constructs[ident],))
        changes.insert(at, change)
    lines = renderer.source_lines()
    best: tuple[_Trial, tuple, UndoTemplate] | None = None
    for group, change in list(zip(groups, changes))[:MAX_TEMPLATE_CANDIDATES]:
        trial = _trial(rerun, change)
        if trial is None or trial.common <= boundary.string_prefix.common:
            continue
        if best is None or (trial.holds, trial.common) > (best[0].holds, best[0].common):
            best = (trial, group, change)
        if trial.holds:
            break
    if best is None:
        return None
    trial, group, change = best
    # The construct that ran for the broken message heads a group; a group spread over the file (conditions on one
    # switch) is that construct, then the others as further locations.
    head = next((c for c in group if any(e.message == target for e in ran.get(c.id, ()))), group[0])
    close = [c for c in group if abs(c.line - head.line) <= 5]
    first, last = min(c.line for c in close), max(c.end_line for c in close)
    text = head.description if head.kind != "condition" else f"{head.description} (line {head.line})"
    source = lines[head.line - 1].strip() if 0 < head.line <= len(lines) else ""
    origin, path = boundary.next_prompt.origin, boundary.next_prompt.source_path
    location = Location(origin, path, first, last if last != first else None, text=text or source)
    others = tuple(Location(origin, path, c.line, c.end_line if c.end_line != c.line else None, text=c.description)
                   for c in group if c not in close)
    scope = "everywhere" if change.message == -1 else "from the broken message on"
    how = (f"{location.text} printing the model's own text for {len(change.substitute)} value(s)"
           if change.substitute else " and ".join(c.description for c in group) + f" undone {scope}")
    return trial, (location, *others), f"{head.kind}:{head.name}", how


def _covering(results: list[str], text: str, at: int) -> tuple[str, int] | None:
    """A printed result whose occurrence in `text` holds character `at`, with that occurrence's start."""
    for result in results:
        start = text.find(result, max(0, at - len(result) + 1))
        if 0 <= start <= at < start + len(result):
            return result, start
    return None


def _reprinting_ops(boundary: Boundary, ran: dict[int, list]) -> list[int]:
    """Ops whose printed result holds the first differing character of the next prompt."""
    at = boundary.string_prefix.common
    found = []
    for ident, runs in ran.items():
        results = [r.after for r in runs if isinstance(r.after, str) and len(r.after) > 1 and r.before != r.after]
        if _covering(results, boundary.next_prompt.text, at) is not None:
            found.append(ident)
    return found


def _reprinted_as_written(boundary: Boundary, rerun: Rerun, ran: dict[int, list], ident: int, undo_from: int,
                          rounds: int = 8) -> UndoTemplate | None:
    """Substitute, value by value, the model's own text for what the op printed (from the break to where the two
    sequences agree again), as long as each substitution moves the break on."""
    results = [r.after for r in ran[ident] if isinstance(r.after, str) and len(r.after) > 1 and r.before != r.after]
    prev = boundary.prev_text
    substitute: dict[object, str] = {}
    current, change = boundary, None
    for _ in range(rounds):
        at = current.string_prefix.common
        covered = _covering([r for r in results if r not in substitute], current.next_prompt.text, at)
        if covered is None:
            break
        result, start = covered
        follow = current.next_prompt.text[start + len(result):start + len(result) + 12]
        end = prev.find(follow, at) if follow else -1
        if end <= start:
            break
        substitute[result] = prev[start:end]
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
        elif any(r.before not in ("", None) for r in runs):
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


def _template_kind(boundary: Boundary, construct_kind: str, location: Location) -> str:
    prev, nxt = boundary.prev_text, boundary.next_prompt.text
    at = boundary.string_prefix.common
    kind, _, name = construct_kind.partition(":")
    reasoning = (boundary.parse.reasoning or "").strip()
    reasoning_lost = _reasoning_lost_at_break(boundary)
    if reasoning_lost and (kind == "condition" or kind == "output"):
        return "reasoning-dropped"
    if (boundary.completion.truncated and at >= len(prev) - 1) or _close_inserted(prev, nxt, at):
        return "close-inserted"
    if kind == "op" and (name in ("tojson", "string") or "json" in name):
        return "args-reserialised"
    a, b = prev[at:at + 1], nxt[at:at + 1]
    whitespace_only = (a.isspace() or not a) or (b.isspace() or not b)
    if kind == "op":
        if reasoning and name in ("trim", "strip", "lstrip", "rstrip") and _inside_reasoning(boundary):
            return "reasoning-trimmed"
        if name in ("trim", "strip", "lstrip", "rstrip"):
            return "whitespace-normalised"
        if reasoning_lost:
            return "reasoning-dropped"
        return "content-dropped" if name in ("split", "rsplit") else "whitespace-normalised"
    if kind == "condition":
        return "content-dropped"
    if reasoning_lost:
        return "reasoning-dropped"
    if _in_arguments(boundary):
        return "args-reserialised"
    return "scaffold-changed" if not whitespace_only or not _model_field_at(boundary) else "whitespace-normalised"


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
        if 0 <= start <= at + 40 and text not in nxt:
            return True
    return False


CLOSE_TAGS = ("</think>", "<|end|>", "<|im_end|>", "<|return|>", "<|call|>", "</tool_call>",
              "<|tool_calls_section_end|>", "<｜end▁of▁sentence｜>")


def _close_inserted(prev: str, nxt: str, at: int) -> bool:
    """The next prompt has a close tag at the break (its first characters may be common) that the model did not write
    there."""
    for tag in CLOSE_TAGS:
        for start in range(max(0, at - len(tag) + 1), at + 1):
            if nxt.startswith(tag, start) and not prev.startswith(tag, start):
                return True
    return False


def _inside_reasoning(boundary: Boundary) -> bool:
    at = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    reasoning = boundary.parse.reasoning or ""
    text = boundary.completion.text
    start = text.find(reasoning) if reasoning else -1
    return start >= 0 and start - 2 <= at <= start + len(reasoning) + 2


def _in_arguments(boundary: Boundary) -> bool:
    at = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    if at < 0:
        return False
    tail = boundary.completion.text[:at]
    return any(marker in tail for marker in ("<tool_call>", "<|tool_call_begin|>", "tool_calls>", "to=functions."))


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
    """The first fix, in the order a practitioner would apply them, that a re-run proves."""
    model = context.model
    behaviour_changing: list[tuple[str, Any]] = []
    for kwarg in model.spec.template_kwargs:
        if not isinstance(kwarg.default, bool):
            continue
        value = not context.kwargs.get(kwarg.name, kwarg.default)
        if kwarg.name in context.user_kwargs and context.user_kwargs[kwarg.name] == value:
            continue
        fixed = rerun(WithKwargs({kwarg.name: value}))
        if fixed is None or not fixed.holds:
            continue
        if fixed.prev_prompt.text != boundary.prev_prompt.text:
            # The flip changes the prompt the model answered (e.g. reasoning turned off): its behaviour, not only
            # how its text comes back.
            behaviour_changing.append((kwarg.name, value))
            continue
        return Fix("kwarg", f"set {kwarg.name}={'true' if value else 'false'}", kwarg=kwarg.name, value=value,
                   proof=f"re-run with {kwarg.name}={str(value).lower()}: the boundary holds; the prompt the model "
                         "answered is unchanged")
    if cause.stage == "client":
        setting = next(iter(context.scenario.client))
        return Fix("client", f"send the assistant turn back whole ({setting}="
                             f"{str(CLIENT_SETTINGS[setting]).lower()})", setting=setting,
                   value=CLIENT_SETTINGS[setting], proof=cause.proof)
    for other in _same_engine_versions(context):
        fixed = rerun(WithEngine(other))
        if fixed is not None and fixed.holds:
            return Fix("engine", f"serve with {other}", engine=other,
                       proof=f"re-run with {other}: the boundary holds")
    if behaviour_changing:
        name, value = behaviour_changing[0]
        return Fix("kwarg", f"set {name}={'true' if value else 'false'} (this changes what the model is asked to do: "
                            "nothing that keeps its text fixes the cell)", kwarg=name, value=value,
                   proof=f"re-run with {name}={str(value).lower()}: the boundary holds, but the prompt the model "
                         "answered changes", changes_behaviour=True)
    bridged = rerun(WithEngine("bridge"))
    proof = "re-run with the bridge: the boundary holds" if bridged is not None and bridged.holds else \
        "re-run with the bridge: the next prompt's new messages do not render, so even the bridge does not hold"
    return Fix("bridge", "build the next prompt by appending to the previous token ids (bridge) instead of "
                         "re-rendering", engine="bridge", proof=proof)


def _same_engine_versions(context: BlameContext) -> list[str]:
    """Other versions of the cell's engine that serve this model with the same parser names."""
    if context.engine in ("raw", "bridge"):
        return []
    from engine.parsers import get_engine, list_engines

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
        others.append(spec)
    return others
