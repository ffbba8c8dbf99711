"""The break view of a trace step and the exports that carry the evidence (JSON, Markdown).

A step's view lines up request k-1's sequence (prompt + completion ids, as logged) and request k's prompt ids around
the first differing token, with engine.evidence's side-by-side layout. When the replay reproduced the step, the view
is the replay's (the same ids, and each character's message and template line); otherwise the logged ids alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.errors import ExplorerError
from engine.evidence import BreakView, CompareSide, compare
from engine.evidence import break_view as boundary_view
from engine.models import LoadedModel
from engine.traces.report import TraceReport
from engine.traces.truth import TraceStep

TRACE_EVIDENCE_FORMAT = "drift-trace-evidence/1"


class _DecodedStarts(Sequence[int]):
    """Where each token starts in the decoded text, computed for the positions a view asks about."""

    def __init__(self, model: LoadedModel, ids: tuple[int, ...]) -> None:
        self.model, self.ids, self.cache = model, ids, {}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):  # type: ignore[override]
        if i not in self.cache:
            assert self.model.tokenizer is not None
            self.cache[i] = len(self.model.tokenizer.decode(self.ids[:i]))
        return self.cache[i]


def _step(report: TraceReport, session: int, request: int) -> TraceStep:
    if not 1 <= session <= len(report.sessions):
        raise ExplorerError(f"{report.source} has sessions 1..{len(report.sessions)}, not {session}")
    steps = report.sessions[session - 1].steps
    if not 1 <= request <= len(steps):
        raise ExplorerError(f"session {session} of {report.source} has requests 1..{len(steps)}, not {request}")
    return steps[request - 1]


def step_view(model: LoadedModel, report: TraceReport, session: int, request: int, context: int = 8) -> BreakView:
    """Request `request` of session `session` against the previous request's sequence, around the first break."""
    step = _step(report, session, request)
    if request < 2:
        raise ExplorerError(f"request 1 of session {session} has no previous request to compare with")
    replay = report.replays.get((session, request))
    if replay is not None and replay.reproduced and replay.boundary is not None:
        return boundary_view(model, replay.boundary, context)
    if model.tokenizer is None:
        raise ExplorerError(f"model {model.id} has no tokenizer here, so the logged ids cannot be shown as text")
    if step.previous_sequence_ids is None or step.prompt_ids is None:
        raise ExplorerError(f"request {request} of session {session} does not break: there is no break to show")
    sides = []
    for label, ids in ((f"request {request - 1}'s prompt + completion (logged)", step.previous_sequence_ids),
                       (f"request {request}'s prompt (logged)", step.prompt_ids)):
        text = model.tokenizer.decode(ids)
        sides.append(CompareSide(label, text, (-1,) * len(text), (0,) * len(text), ids,
                                 _DecodedStarts(model, ids)))  # type: ignore[arg-type]
    return compare(model.tokenizer, sides[0], sides[1], boundary=request, source_path="", context=context)


def view_json(view: BreakView) -> dict[str, Any]:
    def side(s) -> dict[str, Any]:
        return {"label": s.label, "char_start": s.char_start, "text": s.text,
                "tokens": [{"position": r.position, "id": r.id, "text": r.text, "special": r.special,
                            "message_index": r.message_index, "source_line": r.source_line, "differs": r.differs}
                           for r in s.rows]}

    return {"level": view.level, "first_token": view.first_token, "first_char": view.first_char,
            "previous": side(view.prev), "next": side(view.next), "source_path": view.source_path}


def trace_evidence(report: TraceReport, model: LoadedModel | None, context: int = 8) -> dict[str, Any]:
    """The report's JSON, and for every break both sides around it and its cause: what a bug report needs."""
    report.attribute_all()
    data = {"format": TRACE_EVIDENCE_FORMAT, **report.to_json(),
            "asset_hashes": dict(model.asset_hashes) if model else {}}
    if model is None or model.tokenizer is None:
        return data
    for s_no, session in enumerate(data["sessions"], start=1):
        for request in session["requests"]:
            if request["breaks"]:
                request["window"] = view_json(step_view(model, report, s_no, request["index"], context))
    return data


def trace_markdown(report: TraceReport) -> str:
    report.attribute_all()
    lines = [f"# Prefix cache breaks in {report.source}", "",
             f"{report.format}, {len(report.sessions)} session(s), {report.requests} requests"
             + (f"; model {report.model}" if report.model else "")
             + (f"; replayed through {report.engine}" if report.engine else ""), "",
             "| session | request | prompt | reused | prefill | first differing token | cause |",
             "|---|---|---|---|---|---|---|"]
    for s_no, session in enumerate(report.sessions, start=1):
        for step in session.steps:
            if step.first_break is None:
                continue
            b = step.first_break
            replay = report.replays.get((s_no, step.row.index))
            cause = replay.cause if replay else None
            why = (f"{cause.stage} ({cause.kind}) at `{cause.location}`" if cause else
                   (replay.detail if replay else "not replayed (name --engine)"))
            lines.append(f"| {s_no} | {step.row.index} | {step.row.prompt_tokens} | {step.row.reusable_tokens} | "
                         f"{step.row.prefill_tokens} | {b.token}: `{b.previous_token_text!r}` → "
                         f"`{b.next_token_text!r}` | {why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
