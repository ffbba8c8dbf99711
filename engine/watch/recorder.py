"""The watch's recorder process (`python -m engine.watch.recorder`, started by the proxy, at nice 10): the records
file's writer and the keeper of the watch's state, between the proxy and the analysis.

The proxy writes each finished exchange as a frame to a pipe; here the `Recorder` (record.py) writes its records
line and offers it to the analysis through a bounded queue (full: not analysed live, still written, counted). A
sender thread hands the queued lines to the analysis process (live.py, which this process starts, at the lowest CPU
priority) on its stdin; an events thread reads what the analysis found from its stdout. From both, `WatchState`
keeps the counts and the Prometheus metrics, and writes them beside the records at most every `WRITE_EVERY_S`:
status.json (what the proxy's /watch/state and the app's Live page show) and metrics.prom (what the proxy's /metrics
serves). So the proxy itself runs one thread, its event loop, and parses no JSON: no other thread of it can hold its
interpreter when a request needs it.

Light: this process imports neither the model nor the analysis (the analysis process does).
"""

from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from prometheus_client import generate_latest

from engine.watch.metrics import WatchMetrics
from engine.watch.record import (
    METRICS_NAME,
    OUTCOMES,
    STATUS_FORMAT,
    STATUS_NAME,
    AnalysisSettings,
    Recorder,
    write_bytes_atomic,
    write_json_atomic,
)

WRITE_EVERY_S = 0.25  # status.json and metrics.prom are rewritten at most this often, and at the end


class WatchState:
    """The counts and metrics of a watch, from the recorder's lines and the analysis' events (either thread)."""

    def __init__(self, settings: AnalysisSettings) -> None:
        self.settings = settings
        self.metrics = WatchMetrics(settings.model, settings.engine, settings.status_base.get("upstream", ""))
        self.lock = threading.Lock()
        self.analysis_state = "starting"
        self.recorded = 0
        self.offered = 0  # lines the analysis was given
        self.dropped = 0
        self.processed = 0  # lines the analysis has been through (analysed, refused, or not a complete exchange)
        self.analysed = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.pids: dict[str, int | None] = {"proxy": os.getppid(), "recorder": os.getpid(), "analysis": None}
        self.changed = True

    def line_written(self, seq: int, outcome: str, offered: bool) -> None:
        with self.lock:
            self.recorded += 1
            self.outcomes[outcome] += 1
            self.metrics.requests.labels(outcome).inc()
            if offered:
                self.offered += 1
            else:
                self.dropped += 1
                self.metrics.dropped.inc()
            self._queued()

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        with self.lock:
            if kind == "ready":
                self.analysis_state = "ready"
            elif kind == "fatal":
                self.analysis_state = f"failed: {event['sentence']}"
            elif kind == "done":
                if not self.analysis_state.startswith("failed"):  # a model that never loaded stays the news
                    self.analysis_state = "done"
            else:  # span, error, skipped: one line the analysis has been through
                self.processed += 1
                self.analysed += kind == "span"
                self.metrics.observe(event)
            self._queued()

    def analysis_ended(self, returncode: int | None) -> None:
        with self.lock:
            if self.analysis_state in ("starting", "ready"):
                self.analysis_state = "done" if returncode == 0 else "stopped"
            self.changed = True

    def _queued(self) -> None:
        self.metrics.queued.set(self.offered - self.processed)
        self.changed = True

    def status(self) -> dict[str, Any]:
        return {"format": STATUS_FORMAT, **self.settings.status_base, "records": self.settings.records_name,
                "updated": time.time(), "analysis": self.analysis_state, "recorded": self.recorded,
                "requests": dict(self.outcomes), "dropped": self.dropped, "analysed": self.analysed,
                "queued": self.offered - self.processed, "pids": dict(self.pids)}

    def write(self) -> None:
        """status.json and metrics.prom, each replaced whole."""
        folder = Path(self.settings.out_dir)
        with self.lock:
            status, metrics = self.status(), generate_latest(self.metrics.registry)
            self.changed = False
        try:
            write_json_atomic(folder / STATUS_NAME, status)
            write_bytes_atomic(folder / METRICS_NAME, metrics)
        except OSError:
            pass  # the folder went away: the proxy still passes requests through


def _send_lines(lines: queue.Queue, records: Path, stdin: IO[bytes]) -> None:
    """Queued lines (line number, offset, length) to the analysis process, each read back from the records file
    (written and flushed before it was queued), one "N line" per line, until None."""
    try:
        source: int | None = os.open(records, os.O_RDONLY)
    except OSError:
        source = None  # nothing to send: the queue is still drained, so that the recorder never waits on it
    while (item := lines.get()) is not None:
        if source is None:
            continue
        number, offset, length = item
        try:
            stdin.write(b"%d " % number)
            stdin.write(os.pread(source, length, offset))  # the line ends in its own newline
            stdin.flush()
        except (OSError, ValueError):  # the analysis is gone (or the file): lines are still recorded
            os.close(source)
            source = None
    if source is not None:
        os.close(source)
    try:
        stdin.close()
    except BrokenPipeError:
        pass


def _read_events(process: subprocess.Popen, state: WatchState) -> None:
    """The analysis' events until it ends; the state written when it changed, at most every WRITE_EVERY_S."""
    assert process.stdout is not None
    fd, pending, written = process.stdout.fileno(), b"", 0.0
    while True:
        ready, _, _ = select.select([fd], [], [], WRITE_EVERY_S)
        if ready:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                state.event(json.loads(line))
        if state.changed and time.monotonic() - written >= WRITE_EVERY_S:
            state.write()
            written = time.monotonic()
    state.analysis_ended(process.wait())


def run_recorder(settings: AnalysisSettings, frames_fd: int) -> None:
    """Frames from `frames_fd` until the proxy closes it: each written to the records and offered to the analysis
    process; the state kept; then the analysis let finish what it was given."""
    try:
        os.nice(10)
    except OSError:
        pass
    state = WatchState(settings)
    state.write()
    # One tokenizer thread: the analysis runs only on time no one else wants.
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    analysis = subprocess.Popen([sys.executable, "-m", "engine.watch.live", json.dumps(asdict(settings))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    state.pids["analysis"] = analysis.pid
    lines: queue.Queue = queue.Queue(settings.queue_size)
    assert analysis.stdin is not None
    records = Path(settings.out_dir) / settings.records_name
    sender = threading.Thread(target=_send_lines, args=(lines, records, analysis.stdin), name="drift-watch-lines",
                              daemon=True)
    events = threading.Thread(target=_read_events, args=(analysis, state), name="drift-watch-events", daemon=True)
    sender.start()
    events.start()
    Recorder(records, lines, state.line_written).run(
        os.fdopen(frames_fd, "rb"))  # until the proxy is done; then None ends the lines
    sender.join()
    events.join()
    state.write()


def main(argv: list[str]) -> None:
    """python -m engine.watch.recorder SETTINGS_JSON FRAMES_FD (the proxy starts it)."""
    run_recorder(AnalysisSettings(**json.loads(argv[0])), int(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
