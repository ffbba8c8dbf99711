"""Cause attribution, computed rather than looked up.

Engine or template? The same cell is re-run with the lossless `raw` parser: if raw holds where the engine breaks,
the engine's first text-changing edit is the cause (with its source line). Otherwise the template line that emitted
the first differing character of the next prompt is. A break at token level only is a tokenizer boundary cause.
Fix hints are computed too: each boolean template kwarg is flipped, and other versions of the engine are tried;
the first that makes the boundary hold is the hint, else the bridge.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models import LoadedModel
from engine.scenario import CLIENT_SETTINGS, SCENARIOS_DIR, Scenario
from engine.simulate import Boundary, Cause, local_scenario, run_cell_with
from engine.types import Edit


def _first_break(boundaries: tuple[Boundary, ...]) -> Boundary:
    return next(b for b in boundaries if not b.holds)


def _boundary_holds(model: LoadedModel, scenario_id: str, engine: str, kwargs: dict, index: int) -> bool:
    # Only boundary `index` matters: the re-run stops there, and attributes nothing.
    cell = run_cell_with(model, scenario_id, engine, kwargs, explain=False, stop_after=index)
    if cell.status != "holds" and cell.status != "breaks":
        return False
    match = [b for b in cell.boundaries if b.index == index]
    return bool(match) and match[0].holds


def _fix_hint(model: LoadedModel, scenario: Scenario, engine: str, user_kwargs: dict, index: int,
              stage: str) -> dict:
    for kwarg in model.spec.template_kwargs:
        if not isinstance(kwarg.default, bool):
            continue
        flipped = {**user_kwargs, kwarg.name: not kwarg.default}
        if _boundary_holds(model, scenario.id, engine, flipped, index):
            return {"kind": "kwarg", "kwarg": kwarg.name, "value": not kwarg.default,
                    "text": f"set {kwarg.name}={'true' if not kwarg.default else 'false'}"}
    if stage == "parser":
        from engine.parsers import get_engine, list_engines

        current = get_engine(engine).spec
        for other in list_engines():
            if other != current and _boundary_holds(model, scenario.id, other, user_kwargs, index):
                return {"kind": "engine", "engine": other, "text": f"serve with {other}"}
    return {"kind": "bridge", "engine": "bridge",
            "text": "build the next prompt by appending to the previous token ids (bridge) instead of re-rendering"}


def _edit_at_break(edits: list[Edit], boundary: Boundary) -> Edit:
    """The parser step that lost the model's bytes where the prompts part.

    An edit covers the break when its input contains the model's text at that offset; among those, the culprit is
    one whose output no longer holds its input up to and including the break character (a step that only removed
    markup after it kept that). Ties go to the narrowest input, whitespace-only inputs (found almost anywhere) last.
    Request-side renames (`before` is a field path) never cover model text.
    """
    completion = boundary.completion.text
    offset = boundary.string_prefix.common - len(boundary.prev_prompt.text)
    ranked = []
    for order, edit in enumerate(edits):
        start = completion.find(edit.before) if edit.before else -1
        while start != -1:
            if start <= offset <= start + len(edit.before):
                kept = edit.before[: offset - start + 1] in edit.after
                ranked.append((kept, edit.before.isspace(), len(edit.before), order, edit))
                break
            start = completion.find(edit.before, start + 1)
    if ranked:
        return min(ranked, key=lambda item: item[:4])[4]
    in_output = [e for e in edits if e.before and e.before in completion]
    return (in_output or edits)[0]


def _client_cause(model: LoadedModel, scenario: Scenario, engine: str, user_kwargs: dict, boundary: Boundary
                  ) -> Cause | None:
    """The scenario's client setting is the cause when the same cell with a client that echoes everything holds."""
    if not scenario.client:
        return None
    default = replace(scenario, id=f"{scenario.id}~default-client", client={})
    with local_scenario(default):
        rerun = run_cell_with(model, default.id, engine, user_kwargs, explain=False, stop_after=boundary.index)
    match = next((b for b in rerun.boundaries if b.index == boundary.index), None)
    if match is None or not match.holds:
        return None
    setting, value = next(iter(scenario.client.items()))
    source = SCENARIOS_DIR.parent / scenario.source
    lines = source.read_text(encoding="utf-8").splitlines() if source.is_file() else []
    line = next((n for n, text in enumerate(lines, 1) if text.strip().startswith(f"{setting}:")), 0)
    return Cause(
        stage="client", kind=f"client-{setting.replace('_', '-')}", location=f"{scenario.source}:{line}",
        origin=f"client (scenario {scenario.id})",
        detail=f"the client sends the assistant turn back with {setting}={value!r}; with a client that echoes what "
               "the engine returned, this boundary holds",
        fix={"kind": "client", "setting": setting, "value": CLIENT_SETTINGS[setting],
             "text": f"send the assistant turn back whole ({setting}={str(CLIENT_SETTINGS[setting]).lower()})"},
        line_text=lines[line - 1].strip() if line else "",
    )


def _classify_template(boundary: Boundary, at: int) -> str:
    prev, nxt = boundary.prev_text, boundary.next_prompt.text
    reasoning = boundary.parse.reasoning
    if boundary.completion.truncated and at >= len(boundary.prev_prompt.text):
        return "closes-truncated-output"
    if reasoning and reasoning.strip() and reasoning.strip() not in nxt[len(boundary.prev_prompt.text) - 200:]:
        return "reasoning-dropped"
    a, b = prev[at:at + 1], nxt[at:at + 1]
    if a.isspace() or b.isspace() or not a or not b:
        return "whitespace-rewritten"
    return "output-rewritten"


def explain_break(model: LoadedModel, scenario: Scenario, engine: str, kwargs: dict[str, Any],
                  user_kwargs: dict[str, Any], boundaries: tuple[Boundary, ...], *, hints: bool = True) -> Cause:
    """`hints=False` leaves `fix` None: the hint re-runs the cell once per kwarg and engine, which the fuzzer,
    counting causes over thousands of conversations, does not need."""
    boundary = _first_break(boundaries)
    if boundary.string_prefix.holds:
        fix = _fix_hint(model, scenario, engine, user_kwargs, boundary.index, "tokenizer") if hints else None
        at = boundary.token_prefix.common if boundary.token_prefix else 0
        prev_ids, next_ids = boundary.prev_ids or (), boundary.next_ids or ()
        return Cause(
            stage="tokenizer", kind="token-boundary",
            location=f"{model.spec.assets['tokenizer'].hub_file}:0", origin=f"tokenizer {model.id}",
            detail=(f"same text, different ids at token {at}: previous {list(prev_ids[at:at + 3])} vs next "
                    f"{list(next_ids[at:at + 3])}; re-tokenizing the whole prompt does not give back the "
                    "completion's own ids"),
            fix=fix,
        )
    if engine not in ("raw", "bridge"):
        raw = run_cell_with(model, scenario.id, "raw", user_kwargs, explain=False, stop_after=boundary.index)
        raw_boundary = next((b for b in raw.boundaries if b.index == boundary.index), None)
        edits = [e for e in (*boundary.parse.edits, *boundary.request_edits) if e.before != e.after]
        if raw_boundary is not None and raw_boundary.string_prefix.holds and edits:
            edit = _edit_at_break(edits, boundary)
            loc = edit.location
            return Cause(
                stage="parser", kind=edit.step, location=str(loc), origin=loc.origin,
                detail=f"{edit.description}: {edit.before[:80]!r} -> {edit.after[:80]!r}",
                fix=_fix_hint(model, scenario, engine, user_kwargs, boundary.index, "parser") if hints else None,
            )
    client = _client_cause(model, scenario, engine, user_kwargs, boundary)
    if client is not None:
        return client
    at = boundary.string_prefix.common
    rendered = boundary.next_prompt
    pos = min(at, len(rendered.text) - 1)
    # A break at the first character of an output chunk means the chunk before it ended early (a branch that
    # left something out); blame the line that emitted that chunk.
    if 0 < pos < len(rendered.text) and rendered.source_line[pos] != rendered.source_line[pos - 1]:
        pos -= 1
    line = rendered.source_line[pos] if pos >= 0 else 0
    lines = model.renderer.source_lines()
    line_text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    prev_snip, next_snip = boundary.prev_text[at:at + 24], rendered.text[at:at + 24]
    return Cause(
        stage="template", kind=_classify_template(boundary, at),
        location=f"{rendered.source_path}:{line}", origin=rendered.origin,
        detail=f"at char {at}: previous {prev_snip!r} vs next {next_snip!r}; emitted by: {line_text[:120]}",
        fix=_fix_hint(model, scenario, engine, user_kwargs, boundary.index, "template") if hints else None,
        line_text=line_text,
    )
