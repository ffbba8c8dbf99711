"""The cause of a break in a column with layers (issue 27): a proxy, a server flag or the template runtime, each proved
by re-running the cell without it; the template's, the engine's or the client's causes stay engine.blame's.

Each layer the column names is taken away alone (a proxy, a flag, the runtime: the runtime's re-run renders with
transformers' Jinja) and the breaking boundary re-run. The layer is the cause when its removal makes the boundary
hold, or else moves the break furthest (the first one that holds, client side first). For the runtime, "moves" is
read in the template's outputs, not in characters, since the two runtimes' texts differ in length before the break
(engine.render.segments): the break must leave the output it was in. The cause then names:
  - a proxy: its rewrite of the history (the Edit its code made, at its file and line);
  - a flag: the release's code that reads it (strip-thinking-cache: the cache keeps only the prompt);
  - the runtime: the construct whose output differs between the two runtimes, rendered alone under both
    (engine.runtime_compare), the template line second.
A break no layer moves is the same break as without the runtime: that column's own cause is shown (its cell is asked
for through `cell_without`, which the simulator hands in), and without a runtime, engine.blame's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine.blame import BlameContext, Rerun
from engine.render import segments as marks
from engine.serving.spec import EngineSpec
from engine.types import Boundary, Cause, CellResult, Edit, Fix, Location, WithEngine

CellWithout = Callable[[EngineSpec], CellResult]


def _removals(spec: EngineSpec) -> list[tuple[str, str, EngineSpec]]:
    """(kind, name, the column without it) for each layer, client side first."""
    found = [("proxy", name, replace(spec, proxies=tuple(p for p in spec.proxies if p != name)))
             for name in spec.proxies]
    found += [("flag", flag.name, replace(spec, flags=tuple(f for f in spec.flags if f != flag)))
              for flag in spec.flags if flag.name != "default-chat-template-kwargs"]
    if spec.runtime is not None:
        found.append(("runtime", spec.runtime, replace(spec, runtime=None)))
    return found


def _runtime_renderer(context: BlameContext):
    from engine.render.runtimes import RuntimeRenderer

    renderer = getattr(context.model.renderer, "inner", context.model.renderer)
    return renderer if isinstance(renderer, RuntimeRenderer) else None


def _break_segment(renderer, request, at: int, *, reference: bool) -> int | None:
    """The index of the output segment holding character `at` of the request's render, by the runtime (reference
    False) or by transformers (True)."""
    from engine.render.runtimes import compare_renders

    compared = compare_renders(renderer, request.messages, request.tools, request.add_generation_prompt,
                               request.kwargs)
    if compared is None:
        return None
    found = compared.reference_segments if reference else compared.runtime_segments
    text = compared.reference_text if reference else compared.runtime_text
    return marks.segment_at(found, min(at, max(len(text) - 1, 0))) if found else None


def _progress(kind: str, boundary: Boundary, again: Boundary, context: BlameContext) -> float | None:
    """How far the re-run without the layer gets past the break: inf when it holds, a positive figure when the break
    moved on, None when it did not."""
    if again.holds:
        return float("inf")
    if kind != "runtime":
        moved = again.string_prefix.common - boundary.string_prefix.common
        if moved == 0 and boundary.string_prefix.holds and boundary.token_prefix and again.token_prefix:
            moved = again.token_prefix.common - boundary.token_prefix.common
        return float(moved) if moved > 0 else None
    renderer = _runtime_renderer(context)
    request = boundary.next_request
    if renderer is None or request is None or again.next_request is None:
        return None
    if again.string_prefix.holds != boundary.string_prefix.holds:  # the runtime broke the text, not the tokens
        return float("inf") if again.string_prefix.holds else None
    mine = _break_segment(renderer, request, boundary.string_prefix.common, reference=False)
    theirs = _break_segment(renderer, again.next_request, again.string_prefix.common, reference=True)
    if mine is None or theirs is None:
        return None
    return float(theirs - mine) if theirs > mine else None


def _words(boundary: Boundary, again: Boundary) -> str:
    total = boundary.string_prefix.prev_len
    if again.holds:
        return "the boundary holds"
    return f"the break moves from character {boundary.string_prefix.common} of {total} to " \
           f"{again.string_prefix.common} of {again.string_prefix.prev_len}"


def explain_layer_break(boundary: Boundary, context: BlameContext, rerun: Rerun, *, hints: bool = True,
                        cell_without: CellWithout | None = None) -> Cause | None:
    """The layer that causes `boundary`'s break, proved by a re-run without it; None when it is none of them and the
    column has no runtime (engine.blame then explains it)."""
    spec = context.engine
    best: tuple[float, int, str, str, EngineSpec, Boundary] | None = None
    for order, (kind, name, without) in enumerate(_removals(spec)):
        again = rerun(WithEngine(without))
        if again is None:
            continue
        progress = _progress(kind, boundary, again, context)
        if progress is None:
            continue
        if best is None or progress > best[0]:
            best = (progress, order, kind, name, without, again)
        if progress == float("inf"):
            break
    if best is not None:
        _, _, kind, name, without, again = best
        if kind == "proxy":
            cause = _proxy_cause(boundary, name, without, again)
        elif kind == "flag":
            cause = _flag_cause(boundary, context, name, without, again)
        else:
            cause = _runtime_cause(boundary, context, without, again)
        if cause is not None:
            return replace(cause, fix=_fix(cause, spec, name, without, again, rerun) if hints else None)
    if spec.runtime is not None and cell_without is not None:
        # The break is the template's (or the engine's) with or without the runtime: that column's cause.
        cell = cell_without(replace(spec, runtime=None))
        if cell.cause is not None:
            return replace(cell.cause, proof=f"{cell.cause.proof}; the same break with {spec.runtime} as with "
                                              "transformers' Jinja (re-run without it: the break does not move)")
    return None


def _fix(cause: Cause, spec: EngineSpec, name: str, without: EngineSpec, again: Boundary, rerun: Rerun) -> Fix:
    """The fix a re-run proves: for an older LiteLLM the pinned one where that holds, else the column without the
    layer."""
    if cause.stage == "proxy" and name.startswith("litellm@"):
        from engine.serving.proxies.litellm import PINNED

        newer = replace(spec, proxies=tuple("litellm" if p == name else p for p in spec.proxies))
        fixed = rerun(WithEngine(newer)) if name != f"litellm@{PINNED}" else None
        if fixed is not None and fixed.holds:
            return Fix("engine", f"use LiteLLM {PINNED}, whose hosted_vllm keeps the field: {newer}",
                       engine=str(newer), proof=f"re-run with {newer}: the boundary holds")
    outcome = "the boundary holds" if again.holds else "this break goes away"
    what = {"proxy": f"send the history to the engine without {name}'s rewrite",
            "cache": "start the server without the flag (it keeps a reply's tokens only for clients that drop the "
                     "reasoning)",
            "runtime": "render the template with transformers' Jinja, or build the next prompt with the runtime that "
                       "built the previous one"}.get(cause.stage, "serve")
    return Fix("engine", f"{what}: {without}", engine=str(without), proof=f"re-run with {without}: {outcome}")


def _sent_value(boundary: Boundary, edit: Edit) -> object:
    """The value the client sent in the field an edit of the history names (`messages[2].reasoning_content`)."""
    request = boundary.next_request
    path = edit.before.partition("=")[0]
    if request is None or request.sent is None or not path.startswith("messages["):
        return None
    index, _, field = path[len("messages["):].partition("].")
    if not index.isdigit() or int(index) >= len(request.sent):
        return None
    return request.sent[int(index)].get(field)


def _proxy_cause(boundary: Boundary, name: str, without: EngineSpec, again: Boundary) -> Cause | None:
    from engine.serving.proxies.base import proxy_origin

    origin = proxy_origin(name)
    edits = [e for e in boundary.layer_edits if e.location.origin.startswith(origin)]
    if not edits:
        return None
    at = boundary.string_prefix.common
    missing = boundary.prev_text[at:at + 24]

    # The rewrite of the field whose text the next prompt lacks at the break comes first (the model's reasoning
    # dropped, say); then a field dropped, changed or renamed, the assistant turns' reasoning and content first.
    def rank(edit: Edit) -> tuple[int, int, int]:
        value = _sent_value(boundary, edit)
        holds_break = isinstance(value, str) and bool(missing.strip()) and missing.strip() in value
        kind = next((i for i, k in enumerate(("_dropped", "_changed", "_renamed")) if edit.step.endswith(k)), 3)
        return 0 if holds_break else 1, kind, 0 if any(f in edit.step for f in ("reasoning", "content")) else 1

    edit = min(edits, key=rank)
    return Cause(
        stage="proxy", kind="proxy-rewrote", locations=(edit.location,),
        changed=f"{edit.description}" + (f": the client sent {str(value)[:80]!r}" if (value := _sent_value(
            boundary, edit)) is not None else f": {edit.before[:80]!r} -> {edit.after[:80]!r}"), fix=None,
        proof=f"re-run without {name} ({without}): {_words(boundary, again)}",
        detail=f"{edit.location.origin} ({edit.location}) {edit.description}; "
               f"{len(edits)} rewrite{'s' if len(edits) != 1 else ''} by it at this boundary",
        edit=edit)


def _flag_cause(boundary: Boundary, context: BlameContext, name: str, without: EngineSpec,
                again: Boundary) -> Cause | None:
    kept = next((e for e in boundary.layer_edits if e.step == "cache_kept_prompt"), None)
    location = kept.location if kept is not None else Location(str(context.engine.release), "server flag", 0,
                                                               text=f"--{name}")
    prev_ids = boundary.prev_prompt_ids or ()
    return Cause(
        stage="cache", kind="cache-dropped", locations=(location,),
        changed=(f"--{name}: the cache keeps the previous prompt's {len(prev_ids)} tokens, not the completion's "
                 f"{len(boundary.completion_ids or ())}" if prev_ids else f"--{name}: the cache keeps only the prompt"),
        fix=None, proof=f"re-run without --{name} ({without}): {_words(boundary, again)}",
        detail=kept.description if kept is not None else f"the server runs with --{name}", edit=kept)


def _runtime_cause(boundary: Boundary, context: BlameContext, without: EngineSpec, again: Boundary) -> Cause | None:
    from engine.runtime_compare import REFERENCE, locate

    renderer = _runtime_renderer(context)
    request = boundary.next_request
    if renderer is None or request is None:
        return None
    found = locate(renderer, request, at=boundary.string_prefix.common)
    if found is None:
        return None
    label = renderer.runtime.label
    contrast = found.contrast
    alone = (f"; rendered alone with the same inputs, {contrast.construct} gives {contrast.runtime_output[:80]!r} "
             f"under {label} and {contrast.reference_output[:80]!r} under {REFERENCE}") if contrast else ""
    at = boundary.string_prefix.common
    return Cause(
        stage="runtime", kind="runtime-differs",
        locations=(found.location, *((found.emitted,) if found.emitted is not None else ())),
        changed=found.sentence(label), fix=None,
        proof=f"re-run with {REFERENCE} instead of {label} ({without}): {_words(boundary, again)}{alone}",
        detail=(f"at char {at}: previous {boundary.prev_text[at:at + 24]!r} vs next "
                f"{boundary.next_prompt.text[at:at + 24]!r}; the {found.kind} the runtimes print otherwise: "
                f"{found.location.text[:120]}"),
        contrast=contrast)

