"""The watch's analysis process (`python -m engine.watch.live`, started by the recorder process, recorder.py): the
analysis of each recorded exchange, off the proxy's interpreter and at the lowest CPU priority there is (SCHED_IDLE,
`lowest_priority`), so that no template render or tokenization ever holds the proxy or takes a CPU it wants.

The recorder hands it each records line it had room for (a bounded queue, then this process' stdin). It runs each
through engine.traces' `TraceAnalysis` (the same one `python -m engine trace` runs over the records file afterwards)
and answers one event per line on its stdout, a JSON line: `span` (OpenTelemetry gen_ai.* attribute names where the
semantic conventions have one, drift.* for ours), `error` or `skipped` (not a complete exchange); `ready` once the
model is loaded, `done` at the end. It keeps `live.json` beside the records: the report of every session so far in
`trace --json`'s shape, and the measured-vs-predicted cache figures. `read_watch` reads that and the recorder's
`status.json` for the app's live page.

Its lag: as SCHED_IDLE it runs only on CPU time nothing else wants, so while the machine is busy it may not run at
all; what waits for it is bounded by the queue (`--queue` lines, and one pipe's buffer), and what comes past that is
recorded but not analysed live, counted as dropped. On a machine with an idle core it keeps up as a normal process
would.

Memory: the model's tokenizer and template only (no other model), caches cut to what a stream of distinct prompts
reuses (`watch_model`), token ids shared per distinct id (engine.traces.readers), and per session only what its next
request needs (`TraceAnalysis`).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError
from engine.models import LoadedModel
from engine.render.cache import CachedRenderer
from engine.tokenize import SegmentCachedTokenizer
from engine.traces.readers import openai_record
from engine.traces.report import ParkedSessions, TraceAnalysis
from engine.traces.truth import TraceStep
from engine.traces.why import Replay
from engine.watch.record import LIVE_NAME, STATUS_NAME, AnalysisSettings, write_json_atomic

LIVE_FORMAT = "drift-watch-live/1"
WRITE_EVERY_S = 0.5  # live.json is rewritten at most this often (and when the queue runs dry, and at the end)
WRITE_SHARE = 0.1  # and never takes more than this share of the analysis' time: its cost grows with the sessions
SESSION_IDLE_S = 300.0  # a session silent this long is parked: what its next request needs goes to disk
PARKED_NAME = "parked"  # the folder beside the records, for this run of the analysis only


def predicted_cached(step: TraceStep, block_size: int) -> int:
    """What a block-granular engine should report as cached for this request, from the session's own history: the
    whole blocks of the reused prefix, short of the prompt's last token (vLLM computes at least that one)."""
    last_block = (step.row.prompt_tokens - 1) // block_size * block_size if step.row.prompt_tokens else 0
    return min(step.row.block_reusable_tokens, max(last_block, 0))


class LiveAnalysis:
    """Recorded lines in, one event per request out; `state()` is what live.json holds."""

    def __init__(self, model: LoadedModel, engine: str | None, block_size: int, records_name: str,
                 parking: ParkedSessions | None = None, session_idle_s: float = SESSION_IDLE_S) -> None:
        self.analysis = TraceAnalysis(model, engine=engine, block_size=block_size, parking=parking)
        self.session_idle_s = session_idle_s
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
        self.analysis.park_idle(self.session_idle_s)
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


def lowest_priority(nice: int | None = None) -> str:
    """Every thread of this process (and what it starts later) below everything else: SCHED_IDLE, which the kernel
    runs only on a CPU that nothing else wants and preempts at once when anything else wakes (a nice level still
    takes turns with the proxy: its share, and a slice before a waking proxy runs); `nice` instead of it (the tests:
    on a machine kept busy by other jobs, an idle-class analysis would wait for them all). What it is set to."""
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [str(os.getpid())]:
        try:
            if nice is None:
                os.sched_setscheduler(int(task), os.SCHED_IDLE, os.sched_param(0))
            else:
                os.setpriority(os.PRIO_PROCESS, int(task), nice)  # per thread on Linux
        except (OSError, AttributeError):
            return "unchanged"
    return "idle" if nice is None else f"nice {nice}"


class _Lines:
    """(line number, line) pairs from the recorder, as "N line" lines on a file descriptor; None when none came
    within `timeout_s`; stops at its end."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pending, self.ready = fd, b"", deque()
        self.ended = False

    def next(self, timeout_s: float) -> tuple[int, str] | None:
        while not self.ready and not self.ended:
            readable, _, _ = select.select([self.fd], [], [], timeout_s)
            if not readable:
                return None
            data = os.read(self.fd, 1 << 16)
            if not data:
                self.ended = True
                break
            *lines, self.pending = (self.pending + data).split(b"\n")
            self.ready.extend(lines)
        if not self.ready:
            raise EOFError
        number, _, line = self.ready.popleft().decode("utf-8").partition(" ")
        return int(number), line + "\n"


def run_analysis(settings: AnalysisSettings) -> None:
    """Lines from stdin until it closes, each analysed; one event per line on stdout (JSON lines), live.json kept.
    The model is loaded at the recorder's priority (a startup cost, once); the analysis then runs at the lowest."""
    from engine.models import load_model

    events = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what anything prints goes to stderr, never among the events

    def send(event: dict[str, Any]) -> None:
        try:
            events.write((json.dumps(event, ensure_ascii=False) + "\n").encode())
            events.flush()
        except BrokenPipeError:  # the recorder is gone
            pass

    folder = Path(settings.out_dir)
    live = None
    try:
        live = LiveAnalysis(watch_model(load_model(settings.model)), settings.engine, settings.block_size,
                            settings.records_name, ParkedSessions(folder / PARKED_NAME), settings.session_idle_s)
    except ExplorerError as err:
        send({"type": "fatal", "sentence": str(err)})
    else:
        _release_free_memory()
        write_json_atomic(folder / LIVE_NAME, live.state())
    lowest_priority(settings.analysis_nice)
    if live is not None:
        send({"type": "ready"})
    _analyse(live, _Lines(0), send, folder / LIVE_NAME)
    if live is not None:
        write_json_atomic(folder / LIVE_NAME, live.state())
    shutil.rmtree(folder / PARKED_NAME, ignore_errors=True)
    send({"type": "done", "analysed": live.analysed if live else 0})


def _analyse(live: LiveAnalysis | None, lines: _Lines, send: Callable[[dict[str, Any]], None],
             live_path: Path) -> None:
    written, cost, dirty = time.monotonic(), 0.0, False
    while True:
        try:
            item = lines.next(WRITE_EVERY_S)
        except EOFError:
            return
        if item is None and live is not None:
            live.analysis.park_idle(live.session_idle_s)  # no traffic: sessions still go idle
        if item is not None:
            if live is None:
                send({"type": "skipped", "line": item[0]})
                continue
            try:
                event = live.add_line(*item)
            except Exception as err:  # noqa: BLE001 - one line the analysis cannot compute; the watch goes on
                event = {"type": "error", "line": item[0], "sentence": f"line {item[0]}: {type(err).__name__}: {err}"}
                live.errors.append(event["sentence"])
            send(event or {"type": "skipped", "line": item[0]})
            dirty = True
        due = max(WRITE_EVERY_S, cost / WRITE_SHARE)
        if live is not None and dirty and (item is None or time.monotonic() - written >= due):
            started = time.monotonic()
            write_json_atomic(live_path, live.state())
            written, dirty = time.monotonic(), False
            cost = written - started


def main(argv: list[str]) -> None:
    """python -m engine.watch.live SETTINGS_JSON (the recorder starts it: lines on stdin, events on stdout)."""
    run_analysis(AnalysisSettings(**json.loads(argv[0])))


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
