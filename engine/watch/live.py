"""The watch's analysis process (`python -m engine.watch.live`, started by the proxy): the recorder and the analysis,
off the proxy's interpreter and below its CPU priority (nice 10), so that no record assembly, template render or
tokenization ever holds the proxy.

The proxy writes each finished exchange as a frame to a pipe; the `Recorder` thread (record.py) writes its records
line and offers it to the analysis through a bounded queue. The analysis (this process' main thread) runs each line
through engine.traces' `TraceAnalysis` (the same one `python -m engine trace` runs over the records file afterwards).
Per line it sends one event back to the proxy on a second pipe, a JSON line: `recorded` (from the recorder), then
`span` (OpenTelemetry gen_ai.* attribute names where the semantic conventions have one, drift.* for ours), `error` or
`skipped` (not a complete exchange). It keeps `live.json` beside the records: the report of every session so far in
`trace --json`'s shape, and the measured-vs-predicted cache figures. `read_watch` reads that and the proxy's
`status.json` for the app's live page.

Memory: the model's tokenizer and template only (no other model), caches cut to what a stream of distinct prompts
reuses (`watch_model`), token ids shared per distinct id (engine.traces.readers), and per session only what its next
request needs (`TraceAnalysis`).
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError
from engine.models import LoadedModel
from engine.render.cache import CachedRenderer
from engine.tokenize import SegmentCachedTokenizer
from engine.traces.readers import openai_record
from engine.traces.report import TraceAnalysis
from engine.traces.truth import TraceStep
from engine.traces.why import Replay
from engine.watch.record import LIVE_NAME, STATUS_NAME, AnalysisSettings, Recorder, write_json_atomic

LIVE_FORMAT = "drift-watch-live/1"
WRITE_EVERY_S = 0.5  # live.json is rewritten at most this often (and when the queue runs dry, and at the end)
WRITE_SHARE = 0.1  # and never takes more than this share of the analysis' time: its cost grows with the sessions


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
        self.errors: deque[str] = deque(maxlen=50)  # the latest sentences
        self.cache = {"compared": 0, "measured": 0, "predicted": 0, "below": 0, "above": 0}

    def add_line(self, line_no: int, line: str) -> dict[str, Any] | None:
        """The event for the exchange on line `line_no`: a span, an error sentence, or None (not a complete
        exchange, so not a request of the analysis)."""
        try:
            request = openai_record(self.records_name, line_no, line)
            if request is None:
                self.incomplete += 1
                return None
            sessions = len(self.analysis.builders)
            key, step, replay = self.analysis.add(request)
        except ExplorerError as err:
            sentence = str(err)
            self.errors.append(sentence)
            return {"type": "error", "line": line_no, "sentence": sentence}
        self.analysed += 1
        return {"type": "span", "new_session": len(self.analysis.builders) > sessions,
                **self._span(line_no, key, step, replay)}

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
                "analysed": self.analysed, "incomplete": self.incomplete, "errors": list(self.errors),
                "cache": dict(self.cache), "block_size": self.block_size, "report": report.to_json()}


def watch_model(model: LoadedModel, strings: int = 64, segments: int = 4096, renders: int = 64) -> LoadedModel:
    """The model with smaller caches: a watch sees each prompt once or twice (its step and a replay), so whole-string
    and render caches sized for the matrix (thousands of entries, each a prompt's ids or text) would only grow; the
    segment cache keeps the pieces sessions share (the system prompt, earlier turns)."""
    tokenizer, renderer = model.tokenizer, model.renderer
    if isinstance(tokenizer, SegmentCachedTokenizer):
        tokenizer = SegmentCachedTokenizer(tokenizer.inner, tokenizer.plan, name=tokenizer.name, max_strings=strings,
                                           max_segments=segments)
    if isinstance(renderer, CachedRenderer):
        renderer = CachedRenderer(renderer.inner, max_entries=renders)
    return replace(model, tokenizer=tokenizer, renderer=renderer)


def _release_free_memory() -> None:
    # glibc keeps what a freed burst used (the tokenizer's JSON parse: some 50 MiB) as the process' own; give it back.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _Events:
    """JSON lines to the proxy, from either thread."""

    def __init__(self, fd: int) -> None:
        self.fd, self.lock = fd, threading.Lock()
        self.listened = True

    def send(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event, ensure_ascii=False) + "\n").encode()
        with self.lock:
            view = memoryview(data)
            try:
                while view and self.listened:
                    view = view[os.write(self.fd, view):]
            except BrokenPipeError:  # the proxy is gone: the records are still written, to the last frame
                self.listened = False


def run_analysis(settings: AnalysisSettings, frames_fd: int, events_fd: int) -> None:
    """Frames from `frames_fd` until it closes: each recorded, and analysed when the queue has room; events to
    `events_fd`; live.json kept. The records are written whatever becomes of the analysis (a model that cannot be
    loaded, a line it cannot compute)."""
    from engine.models import load_model

    try:
        os.nice(10)
    except OSError:
        pass
    events = _Events(events_fd)
    lines: queue.Queue = queue.Queue(settings.queue_size)
    folder = Path(settings.out_dir)
    recorder = Recorder(folder / settings.records_name, lines, lambda seq, outcome, offered: events.send(
        {"type": "recorded", "seq": seq, "outcome": outcome, "offered": offered}))
    recording = recorder.start(os.fdopen(frames_fd, "rb"))
    live = None
    try:
        live = LiveAnalysis(watch_model(load_model(settings.model)), settings.engine, settings.block_size,
                            settings.records_name)
    except ExplorerError as err:
        events.send({"type": "fatal", "sentence": str(err)})
    else:
        _release_free_memory()
        write_json_atomic(folder / LIVE_NAME, live.state())
        events.send({"type": "ready"})
    _analyse(live, lines, events, folder / LIVE_NAME)
    recording.join()
    if live is not None:
        write_json_atomic(folder / LIVE_NAME, live.state())
    events.send({"type": "done", "analysed": live.analysed if live else 0, "recorded": recorder.lines})


def _analyse(live: LiveAnalysis | None, lines: queue.Queue, events: _Events, live_path: Path) -> None:
    written, cost, dirty = time.monotonic(), 0.0, False
    while True:
        try:
            item = lines.get(timeout=WRITE_EVERY_S)
        except queue.Empty:
            item = ...
        if item is None:
            return
        if item is not ...:
            if live is None:
                events.send({"type": "skipped", "line": item[0]})
                continue
            try:
                event = live.add_line(*item)
            except Exception as err:  # noqa: BLE001 - one line the analysis cannot compute; the watch goes on
                event = {"type": "error", "line": item[0], "sentence": f"line {item[0]}: {type(err).__name__}: {err}"}
                live.errors.append(event["sentence"])
            events.send(event or {"type": "skipped", "line": item[0]})
            dirty = True
        due = max(WRITE_EVERY_S, cost / WRITE_SHARE)
        if live is not None and dirty and (item is ... or time.monotonic() - written >= due):
            started = time.monotonic()
            write_json_atomic(live_path, live.state())
            written, dirty = time.monotonic(), False
            cost = written - started


def main(argv: list[str]) -> None:
    """python -m engine.watch.live SETTINGS_JSON FRAMES_FD EVENTS_FD (the proxy starts it)."""
    settings = AnalysisSettings(**json.loads(argv[0]))
    run_analysis(settings, int(argv[1]), int(argv[2]))


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


if __name__ == "__main__":
    main(sys.argv[1:])
