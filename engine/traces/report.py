"""A whole trace analysed: read, grouped into sessions, the ground truth of every step, and why each break."""

from __future__ import annotations

import pickle
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError
from engine.models import LoadedModel
from engine.serving.spec import EngineSpec
from engine.traces.grouping import SessionGrouping
from engine.traces.pipeline import replay_engine
from engine.traces.readers import read_trace
from engine.traces.records import SkippedRecords, TraceFormatError, TraceRequest, skipped_sentence
from engine.traces.truth import SessionBuilder, SessionTruth, TraceStep, ids_of
from engine.traces.why import Replay, explain_step


@dataclass(frozen=True)
class TraceReport:
    source: str
    format: str
    model: str | None
    engine: str | None
    block_size: int
    sessions: tuple[SessionTruth, ...]
    replays: dict[tuple[int, int], Replay] = field(default_factory=dict)  # (session, request) 1-based
    skipped: tuple[TraceFormatError, ...] = ()  # bad records left out (analyse_trace's skip_bad_records), the first 100
    skipped_count: int = 0  # how many there were in all

    @property
    def skipped_sentence(self) -> str | None:
        """One sentence for the bad records left out, or None when every record was read."""
        return skipped_sentence(self.skipped, total=self.skipped_count) if self.skipped else None

    @property
    def requests(self) -> int:
        return sum(len(s.steps) for s in self.sessions)

    def attribute(self, session: int, request: int) -> Replay | None:
        """The replay of that break with its cause attributed (computed once, then kept)."""
        replay = self.replays.get((session, request))
        if replay is not None and replay.pending is not None:
            replay = self.replays[(session, request)] = replay.attributed()
        return replay

    def attribute_all(self) -> None:
        for session, request in list(self.replays):
            self.attribute(session, request)

    def to_json(self) -> dict[str, Any]:
        sessions = []
        for s_no, session in enumerate(self.sessions, start=1):
            requests = []
            for step in session.steps:
                row = step.row
                data: dict[str, Any] = {
                    "index": row.index, "request_id": step.request.request_id, "where": step.request.where,
                    "prompt_tokens": row.prompt_tokens, "completion_tokens": row.decode_tokens,
                    "reused_tokens": row.reusable_tokens, "prefill_tokens": row.prefill_tokens,
                    "block_reused_tokens": row.block_reusable_tokens, "block_prefill_tokens": row.block_prefill_tokens,
                    "hybrid_reused_tokens": row.hybrid_reusable_tokens,
                    "hybrid_prefill_tokens": row.hybrid_prefill_tokens,
                    "previous_sequence_tokens": row.previous_sequence_tokens,
                    "common_with_previous": step.common_with_previous, "matched_request": row.matched_request,
                    "server_cached_tokens": step.request.cached_tokens, "breaks": step.breaks,
                }
                if step.first_break is not None:
                    data["first_break"] = step.first_break.to_json()
                    replay = self.replays.get((s_no, row.index))
                    data["replay"] = replay.to_json() if replay else None
                    data["cause"] = replay.cause.to_json() if replay and replay.cause else None
                requests.append(data)
            sessions.append({
                "session": s_no, "key": session.key, "ids": session.ids_source, "requests": requests,
                "totals": {"prompt_tokens": session.prompt_tokens, "reused_tokens": session.reused_tokens,
                           "prefill_tokens": session.prompt_tokens - session.reused_tokens,
                           "lost_tokens": session.lost_tokens, "breaks": session.breaks},
            })
        return {"source": self.source, "format": self.format, "model": self.model, "engine": self.engine,
                "block_size": self.block_size, "sessions": sessions, "skipped": [str(e) for e in self.skipped],
                "skipped_count": self.skipped_count}


class ParkedSessions:
    """Idle sessions' state (`SessionBuilder.park`), one file each in `folder`, out of memory until the session's
    next request takes it back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, Path] = {}
        self.made = 0

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def __len__(self) -> int:
        return len(self.files)

    def put(self, key: str, state: dict[str, Any]) -> None:
        self.made += 1
        path = self.folder / f"{self.made}.pickle"
        path.write_bytes(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        self.files[key] = path

    def take(self, key: str) -> dict[str, Any]:
        path = self.files.pop(key)
        state = pickle.loads(path.read_bytes())  # noqa: S301 - a file this process wrote
        path.unlink()
        return state


class TraceAnalysis:
    """Requests analysed one at a time, as they are read (`analyse_trace`) or as they arrive (`python -m engine
    watch`): each is assigned to its session and its step computed at once, and only what a later request needs is
    kept (per session its latest sequence and request; per break both sides), so memory follows the sessions and the
    breaks, not the traffic. With `engine` and a model, each break is replayed (`attribute=False`: the causes of
    reproduced breaks wait for `TraceReport.attribute`).

    With `parking` (the watch's), `park_idle` moves what an idle session's next request would need to disk, so
    memory follows the sessions still talking; a parked session's next request takes it back first, and gets the
    same step as if it had never left."""

    def __init__(self, model: LoadedModel | None = None, *, engine: EngineSpec | str | None = None,
                 block_size: int = 16, checkpoint_policy: str = "prompt-and-generation-end", explain: bool = True,
                 hints: bool = True, attribute: bool = True, parking: ParkedSessions | None = None) -> None:
        self.model, self.block_size, self.policy = model, block_size, checkpoint_policy
        self.spec = replay_engine(engine) if engine is not None else None
        self.explain, self.hints, self.attribute = explain, hints, attribute
        self.grouping = SessionGrouping()
        self.builders: dict[str, SessionBuilder] = {}
        self.named: set[str] = set()  # sessions the trace names itself
        self.replays: dict[tuple[str, int], Replay] = {}
        self.format: str | None = None
        self.parking = parking
        self.active: OrderedDict[str, float] = OrderedDict()  # with parking: unparked sessions, least recent first

    def add(self, request: TraceRequest) -> tuple[str, TraceStep, Replay | None]:
        """The request's session key, its step, and the replay of its break (None when it holds or is not
        replayed)."""
        self.format = self.format or request.format
        prompt, completion, source = ids_of(self.model, request, self.spec)
        key = self.grouping.assign(request, prompt, completion)
        if request.session is not None:
            self.named.add(key)
        builder = self.builders.get(key)
        if builder is None:
            builder = self.builders[key] = SessionBuilder(key, self.model, source, self.block_size, self.policy)
        if self.parking is not None:
            if key in self.parking:
                builder.resume(self.parking.take(key))
            self.active[key] = time.monotonic()
            self.active.move_to_end(key)
        previous = builder.previous_request
        previous_prompt, previous_completion = builder.previous_prompt, builder.previous_completion
        step = builder.add(request, prompt, completion, source)
        replay = None
        if step.breaks and self.explain and self.model is not None and self.spec is not None and previous is not None:
            replay = self.replays[(key, step.row.index)] = explain_step(
                self.model, self.spec, previous, request, previous_completion, previous_prompt, prompt,
                step.row.index - 1, hints=self.hints, attribute_now=self.attribute)
        return key, step, replay

    def park_idle(self, idle_s: float) -> int:
        """Park every session whose latest request came `idle_s` or more seconds ago (with `parking`); how many."""
        parked, cutoff = 0, time.monotonic() - idle_s
        while self.parking is not None and self.active:
            key, last = next(iter(self.active.items()))
            if last > cutoff:
                break
            del self.active[key]
            self.parking.put(key, self.builders[key].park())
            parked += 1
        return parked

    def report(self, label: str, trace_format: str | None = None,
               skipped: tuple[TraceFormatError, ...] = (), skipped_count: int = 0) -> TraceReport:
        """Every session so far, in the order of its first request (those the grouping found numbered in that
        order)."""
        ordered = sorted(self.builders.values(), key=lambda b: b.first_order)
        truths = []
        numbered: dict[tuple[int, int], Replay] = {}
        for n, builder in enumerate(ordered, start=1):
            truth = builder.truth()
            if builder.key not in self.named:  # a session grouping found: numbered in the order of its first request
                truth = replace(truth, key=f"{truth.key.rsplit('-', 1)[0]}-{n}")
            truths.append(truth)
            for (key, index), replay in self.replays.items():
                if key == builder.key:
                    numbered[(n, index)] = replay
        return TraceReport(label, trace_format or self.format or "", self.model.id if self.model else None,
                           str(self.spec) if self.spec else None, self.block_size, tuple(truths), numbered,
                           tuple(skipped), skipped_count)


def analyse_trace(path: str | Path, model: LoadedModel | None = None, *, engine: EngineSpec | str | None = None,
                  trace_format: str | None = None, block_size: int = 16,
                  checkpoint_policy: str = "prompt-and-generation-end", explain: bool = True,
                  hints: bool = True, attribute: bool = True, name: str | None = None,
                  skip_bad_records: bool = False) -> TraceReport:
    """Read `path` request by request through a `TraceAnalysis`: one pass, memory following the sessions and the
    breaks, not the file.

    `skip_bad_records`: a bad record does not stop the analysis; it is left out (readers.py says what is kept, per
    format) and listed in the report's `skipped`. A file none of whose records is complete is still refused.
    """
    label = name or Path(path).name
    analysis = TraceAnalysis(model, engine=engine, block_size=block_size, checkpoint_policy=checkpoint_policy,
                             explain=explain, hints=hints, attribute=attribute)
    skipped = SkippedRecords() if skip_bad_records else None
    for request in read_trace(path, trace_format, name=label, skipped=skipped):
        analysis.add(request)
    if not analysis.builders:
        if skipped:
            raise TraceFormatError(skipped_sentence(skipped).replace("the rest of the file was read",
                                                                     "no other record is a complete request"))
        raise ExplorerError(f"{label} holds no complete request (a prompt and its completion)")
    return analysis.report(label, trace_format, tuple(skipped or ()), skipped.count if skipped is not None else 0)


def report_text(report: TraceReport) -> str:
    """For people: one line per session, one per request that breaks, with its cause."""
    lines = [f"{report.source}: {report.format}, {len(report.sessions)} session(s), {report.requests} requests"
             + (f", model {report.model}" if report.model else "") + (f", replayed through {report.engine}"
                                                                      if report.engine else "")
             + (f", {report.skipped_count} bad record(s) skipped" if report.skipped else "")]
    for s_no, session in enumerate(report.sessions, start=1):
        lines.append(f"session {s_no} ({session.key}, ids {session.ids_source}): {len(session.steps)} requests, "
                     f"{session.prompt_tokens} prompt tokens, {session.reused_tokens} reused, "
                     f"{session.breaks} break(s), {session.lost_tokens} tokens of cache lost")
        for step in session.steps:
            if not step.breaks or step.first_break is None:
                continue
            b = step.first_break
            line = (f"  request {step.row.index} ({step.request.where}): reuses {step.row.reusable_tokens} of "
                    f"{step.row.previous_sequence_tokens}, prefills {step.row.prefill_tokens}; first differing token "
                    f"{b.token}: {b.previous_token_text!r} -> {b.next_token_text!r}")
            replay = report.replays.get((s_no, step.row.index))
            if replay is not None:
                line += f"\n    {replay.detail}"
                if replay.cause is not None:
                    line += f"\n    {replay.cause.detail}"
            lines.append(line)
    return "\n".join(lines)
