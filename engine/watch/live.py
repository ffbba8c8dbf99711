"""The watch's analysis: each recorded exchange, as it is written, through engine.traces' `TraceAnalysis` (the same
one `python -m engine trace` runs over the records file afterwards), in a process of its own so that no template
render or tokenization ever holds the proxy's interpreter.

Per request it sends one span-like event back to the proxy (`span`: OpenTelemetry gen_ai.* attribute names where the
semantic conventions have one, drift.* for ours), and it keeps `live.json` beside the records: the report of every
session so far in `trace --json`'s shape, and the measured-vs-predicted cache figures. `read_watch` reads that and
the proxy's `status.json` for the app's live page.
"""

from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError
from engine.models import LoadedModel
from engine.traces.readers import openai_record
from engine.traces.report import TraceAnalysis
from engine.traces.truth import TraceStep
from engine.traces.why import Replay

LIVE_NAME, STATUS_NAME = "live.json", "status.json"
LIVE_FORMAT = "drift-watch-live/1"
WRITE_EVERY_S = 0.5  # live.json is rewritten at most this often (and when the queue runs dry, and at the end)


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace `path` whole: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def predicted_cached(step: TraceStep, block_size: int) -> int:
    """What a block-granular engine should report as cached for this request, from the session's own history: the
    whole blocks of the reused prefix, short of the prompt's last token (vLLM computes at least that one)."""
    last_block = (step.row.prompt_tokens - 1) // block_size * block_size if step.row.prompt_tokens else 0
    return min(step.row.block_reusable_tokens, max(last_block, 0))


class LiveAnalysis:
    """Recorded lines in, one event per request out; `state()` is what live.json holds."""

    def __init__(self, model: LoadedModel, engine: str | None, block_size: int, records_name: str) -> None:
        self.analysis = TraceAnalysis(model, engine=engine, block_size=block_size)
        self.block_size, self.records_name = block_size, records_name
        self.engine = engine
        self.analysed = 0
        self.incomplete = 0
        self.errors: list[str] = []
        self.cache = {"compared": 0, "measured": 0, "predicted": 0, "below": 0, "above": 0}
        self.sessions_seen: set[str] = set()

    def add_line(self, line_no: int, line: str) -> dict[str, Any] | None:
        """The event for the exchange on line `line_no`: a span, an error sentence, or None (not a complete
        exchange, so not a request of the analysis)."""
        try:
            request = openai_record(self.records_name, line_no, line)
            if request is None:
                self.incomplete += 1
                return None
            key, step, replay = self.analysis.add(request)
        except ExplorerError as err:
            sentence = str(err)
            self.errors.append(sentence)
            return {"type": "error", "line": line_no, "sentence": sentence}
        self.analysed += 1
        new_session = key not in self.sessions_seen
        self.sessions_seen.add(key)
        return {"type": "span", "new_session": new_session, **self._span(line_no, key, step, replay)}

    def _span(self, line_no: int, key: str, step: TraceStep, replay: Replay | None) -> dict[str, Any]:
        request, row = step.request, step.row
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": request.model,
            "gen_ai.response.id": request.request_id,
            "gen_ai.conversation.id": key,
            "gen_ai.usage.input_tokens": row.prompt_tokens,
            "gen_ai.usage.output_tokens": row.decode_tokens,
            "drift.record.line": line_no,
            "drift.request.index": row.index,
            "drift.prefix.reused_tokens": row.reusable_tokens,
            "drift.prefix.block_reused_tokens": row.block_reusable_tokens,
            "drift.prefix.prefill_tokens": row.prefill_tokens,
        }
        if self.engine:
            attributes["gen_ai.provider.name"] = self.engine.partition("@")[0]
        if request.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [request.finish_reason]
        if step.first_break is not None:
            attributes["drift.break.token"] = step.first_break.token
            attributes["drift.prefix.lost_tokens"] = row.previous_sequence_tokens - row.reusable_tokens
            cause = replay.cause if replay is not None else None
            attributes["drift.break.stage"] = cause.stage if cause else "unattributed"
            attributes["drift.break.kind"] = cause.kind if cause else \
                ("not-reproduced" if replay is not None else "not-replayed")
            attributes["drift.break.location"] = str(cause.location) if cause else ""
            attributes["drift.break.detail"] = cause.detail if cause else (replay.detail if replay else "")
        if request.cached_tokens is not None:
            predicted = predicted_cached(step, self.block_size)
            attributes["gen_ai.usage.cache_read.input_tokens"] = request.cached_tokens
            attributes["drift.cache.predicted_tokens"] = predicted
            self.cache["compared"] += 1
            self.cache["measured"] += request.cached_tokens
            self.cache["predicted"] += predicted
            if request.cached_tokens < predicted:
                self.cache["below"] += 1  # the server lost what the session's own history should have kept
            elif request.cached_tokens > predicted:
                self.cache["above"] += 1  # more than the session's history: a prefix shared with other sessions
        return {"name": f"chat {request.model or ''}".strip(), "attributes": attributes}

    def state(self) -> dict[str, Any]:
        report = self.analysis.report(self.records_name, "openai-jsonl")
        return {"format": LIVE_FORMAT, "updated": time.time(), "records": self.records_name,
                "analysed": self.analysed, "incomplete": self.incomplete, "errors": self.errors[-50:],
                "cache": dict(self.cache), "block_size": self.block_size, "report": report.to_json()}


@dataclass(frozen=True)
class AnalysisSettings:
    model: str
    engine: str | None
    block_size: int
    out_dir: str
    records_name: str


def run_analysis(settings: AnalysisSettings, lines: Any, events: Any) -> None:
    """The analysis process: (line number, line) from `lines` until None; events to `events`; live.json kept."""
    from engine.models import load_model

    try:
        model = load_model(settings.model)
    except ExplorerError as err:
        events.put({"type": "fatal", "sentence": str(err)})
        return
    live = LiveAnalysis(model, settings.engine, settings.block_size, settings.records_name)
    live_path = Path(settings.out_dir) / LIVE_NAME
    write_json_atomic(live_path, live.state())
    events.put({"type": "ready"})
    written, dirty = time.monotonic(), False
    while True:
        try:
            item = lines.get(timeout=WRITE_EVERY_S)
        except queue.Empty:
            item = ...
        if item is None:
            break
        if item is not ...:
            event = live.add_line(*item)
            if event is not None:
                events.put(event)
            dirty = True
        if dirty and (item is ... or time.monotonic() - written >= WRITE_EVERY_S):
            write_json_atomic(live_path, live.state())
            written, dirty = time.monotonic(), False
    write_json_atomic(live_path, live.state())
    events.put({"type": "done", "analysed": live.analysed})


@dataclass(frozen=True)
class WatchSnapshot:
    """What a watch has written to its folder so far: the proxy's status and the analysis' live state."""

    folder: Path
    status: dict[str, Any]
    live: dict[str, Any]

    @property
    def records(self) -> Path:
        return self.folder / self.live.get("records", "records.jsonl")

    @property
    def report(self) -> dict[str, Any]:
        return self.live.get("report") or {"sessions": []}

    def breaks(self) -> list[dict[str, Any]]:
        """Every break so far, in record order: session number, request, figures and cause."""
        found = []
        for session in self.report["sessions"]:
            for request in session["requests"]:
                if request["breaks"]:
                    found.append({"session": session["session"], "key": session["key"], **request})
        return found


def read_watch(folder: str | Path) -> WatchSnapshot:
    """The watch folder's status.json and live.json; one sentence when it is not a watch's folder."""
    folder = Path(folder)
    parts = {}
    for name in (STATUS_NAME, LIVE_NAME):
        path = folder / name
        try:
            parts[name] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            parts[name] = {}
        except (OSError, ValueError) as err:
            raise ExplorerError(f"{path} cannot be read as a watch's state ({err})") from None
    if not parts[STATUS_NAME] and not parts[LIVE_NAME]:
        raise ExplorerError(f"{folder} holds no watch state (status.json, live.json): start python -m engine watch "
                            "--out with this folder")
    if parts[LIVE_NAME] and parts[LIVE_NAME].get("format") != LIVE_FORMAT:
        raise ExplorerError(f"{folder / LIVE_NAME} is not a watch's live state ({LIVE_FORMAT})")
    return WatchSnapshot(folder, parts[STATUS_NAME], parts[LIVE_NAME])
