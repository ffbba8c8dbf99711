"""The pass-through: an ASGI app (uvicorn) in front of an OpenAI-compatible upstream (httpx).

Every request goes to the upstream as the client sent it: the same method, path, query and body bytes, and the same
headers less the hop-by-hop ones (Host names the upstream; httpx adds none of its own). Every response comes back as
the upstream sent it: its status, its headers less the hop-by-hop ones, its body chunk by chunk as the bytes arrive
(httpx's raw stream: nothing decoded or re-encoded). When the upstream breaks off mid-body, the client's connection is
broken off too, as the upstream's would have been; when the client goes away, the upstream request is closed (vLLM
and SGLang then abort the generation).

Chat requests (POST {prefix}/chat/completions) are also recorded: when the exchange ends, however it ends, the
request task hands it to the recorder thread (a queue put, nothing more on the request path), which writes its line
to the records file, in the order the exchanges ended, and then offers the line to the analysis process through a
bounded queue; when that queue is full the line is not analysed live (still recorded) and
drift_watch_analysis_dropped_total counts it. `/metrics` is Prometheus' text format; `/watch/state` the status as
JSON (status.json holds the same, rewritten once a second).
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import queue
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.errors import ExplorerError
from engine.watch.live import STATUS_NAME, AnalysisSettings, run_analysis, write_json_atomic
from engine.watch.metrics import WatchMetrics
from engine.watch.record import OUTCOMES, RECORDS_NAME, Exchange, parse_request, record_line

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1: headers for one connection, not to be forwarded; Host is the upstream's.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"transfer-encoding", b"upgrade", b"host", b"proxy-connection"})
STATUS_FORMAT = "drift-watch-status/1"


class UpstreamCut(Exception):
    """The upstream broke off mid-body: raised after the exchange is recorded, so that the server drops the client's
    connection too."""


class _QuietCuts(logging.Filter):
    # uvicorn logs an exception that ends a response as "Exception in ASGI application" with a traceback; a cut that
    # the upstream made is an outcome the watch records, not a bug of the watch.
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], UpstreamCut))


@dataclass(frozen=True)
class WatchSettings:
    upstream: str  # http://HOST:PORT/v1
    model: str
    engine: str | None = None
    host: str = "127.0.0.1"
    port: int = 8400
    out_dir: str = "drift-watch"
    block_size: int = 16
    queue_size: int = 256  # exchanges waiting for the analysis at most

    @property
    def origin(self) -> str:
        parts = urlsplit(self.upstream)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def chat_path(self) -> str:
        return urlsplit(self.upstream).path.rstrip("/") + "/chat/completions"


def checked_upstream(url: str) -> str:
    """`--upstream` as http(s)://HOST:PORT[/prefix]; one sentence otherwise."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or parts.query or parts.fragment:
        raise ExplorerError(f"--upstream must be an http:// or https:// URL such as http://localhost:8000/v1, got "
                            f"{url[:80]!r}")
    return url.rstrip("/")


class Recorder:
    """The records file's only writer: exchanges in, in the order they ended; each line, once written and flushed,
    is offered to the analysis (bounded: a full queue drops it, counted)."""

    def __init__(self, path: Path, analysis: Any, metrics: WatchMetrics) -> None:
        self.path, self.analysis, self.metrics = path, analysis, metrics
        self.pending: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self.lines = 0
        self.dropped = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.file = open(path, "x", encoding="utf-8", newline="\n")  # noqa: SIM115 - the thread closes it
        self.thread = threading.Thread(target=self._run, name="drift-watch-recorder", daemon=True)
        self.thread.start()

    def put(self, exchange: Exchange) -> None:
        self.pending.put(exchange)

    def _run(self) -> None:
        while (exchange := self.pending.get()) is not None:
            line = record_line(exchange)
            self.file.write(line)
            self.file.flush()
            self.lines += 1
            self.outcomes[exchange.outcome] += 1
            self.metrics.requests.labels(exchange.outcome).inc()
            if self.analysis is None:
                continue
            try:
                self.analysis.put_nowait((self.lines, line))
            except queue.Full:
                self.dropped += 1
                self.metrics.dropped.inc()
        self.file.close()

    def close(self) -> None:
        self.pending.put(None)
        self.thread.join()


class PassThrough:
    """The ASGI app: /metrics, /watch/state, and everything else to the upstream."""

    def __init__(self, settings: WatchSettings, recorder: Recorder, metrics: WatchMetrics,
                 status: Callable[[], dict[str, Any]]) -> None:
        self.settings, self.recorder, self.metrics, self.status = settings, recorder, metrics, status
        self.client: httpx.AsyncClient | None = None
        self.seq = 0

    def _client(self) -> httpx.AsyncClient:
        if self.client is None:
            # No pool limit (200 concurrent sessions must not queue behind 100 connections), no read timeout (a
            # generation takes as long as it takes), and none of httpx's default headers: only the client's go out.
            self.client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=30.0), follow_redirects=False, trust_env=False,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024))
            for name in list(self.client.headers):
                del self.client.headers[name]
        return self.client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/metrics" and scope["method"] == "GET":
            await _respond(send, 200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)
            return
        if path == "/watch/state" and scope["method"] == "GET":
            await _respond(send, 200, json.dumps(self.status()).encode(), "application/json")
            return
        await self._forward(scope, receive, send, recorded=scope["method"] == "POST" and
                            path == self.settings.chat_path)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send, *, recorded: bool) -> None:
        started, clock = time.time(), time.perf_counter()
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its request was whole: nothing was sent upstream
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        exchange = None
        if recorded:
            self.seq += 1
            request = parse_request(body)
            exchange = Exchange(self.seq, body, request, bool(request and request.get("stream") is True), started)
            if request is None:
                exchange.outcome = "unreadable-request"
        else:
            self.metrics.passthrough.inc()
        query = scope.get("query_string") or b""
        url = self.settings.origin + scope["raw_path"].decode("latin-1") if scope.get("raw_path") else \
            self.settings.origin + scope["path"]
        url = url.split("?", 1)[0] + ("?" + query.decode("latin-1") if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        client = self._client()
        try:
            upstream = await client.send(client.build_request(scope["method"], url, headers=headers, content=body),
                                         stream=True)
        except httpx.HTTPError as err:
            if exchange is not None:
                exchange.outcome, exchange.error = "upstream-unreachable", f"{type(err).__name__}: {err}"
                exchange.elapsed_ms = (time.perf_counter() - clock) * 1000
                self.recorder.put(exchange)
            await _respond(send, 502, json.dumps({"error": {
                "message": f"the drift watch could not reach the upstream {self.settings.origin} "
                           f"({type(err).__name__})", "type": "upstream_unreachable"}}).encode(), "application/json")
            return
        if exchange is not None:
            exchange.status = upstream.status_code
            exchange.content_encoding = upstream.headers.get("content-encoding")
            if upstream.status_code != 200 and exchange.outcome == "complete":
                exchange.outcome = "upstream-status"
        cut: Exception | None = None
        try:
            cut = await self._stream_back(upstream, exchange, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            if exchange is not None:
                exchange.elapsed_ms = (time.perf_counter() - clock) * 1000
                self.recorder.put(exchange)
        if cut is not None:
            raise UpstreamCut(str(cut)) from cut

    async def _stream_back(self, upstream: httpx.Response, exchange: Exchange | None, receive: Receive,
                           send: Send) -> Exception | None:
        """The upstream's response to the client, chunk by chunk; the upstream's error when it broke off."""
        headers = [(k, v) for k, v in upstream.headers.raw if k.lower() not in HOP_BY_HOP]
        cut: Exception | None = None
        sent_all = False
        async with anyio.create_task_group() as group:

            async def client_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                # (uvicorn also says disconnect once the response is complete)
                if not sent_all and exchange is not None and exchange.outcome in ("complete", "upstream-status"):
                    exchange.outcome = "client-gone"
                group.cancel_scope.cancel()

            group.start_soon(client_gone)
            try:
                await send({"type": "http.response.start", "status": upstream.status_code, "headers": headers})
                async for chunk in upstream.aiter_raw():
                    if exchange is not None:
                        exchange.body += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent_all = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except httpx.HTTPError as err:
                cut = err
                if exchange is not None:
                    exchange.outcome, exchange.error = "upstream-failed", f"{type(err).__name__}: {err}"
            except OSError:  # uvicorn's ClientDisconnected: the client went away while we sent
                if exchange is not None and exchange.outcome in ("complete", "upstream-status"):
                    exchange.outcome = "client-gone"
            group.cancel_scope.cancel()
        return cut


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Watch:
    """A watch: the records file, the analysis process, the recorder, the metrics and the ASGI app.

    `start()` then the server (`serve()`, or an embedding test's uvicorn), then `stop()`, which writes every
    exchange still pending and lets the analysis finish what it was given."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.folder = Path(settings.out_dir)
        self.metrics = WatchMetrics(settings.model, settings.engine, settings.upstream)
        self.analysis_state = "starting"
        self.started = time.time()
        self.process: Any = None
        self.lines: Any = None
        self.events: Any = None
        self.recorder: Recorder | None = None
        self.app: PassThrough | None = None
        self._events_thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> PassThrough:
        records = self.folder / RECORDS_NAME
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ExplorerError(f"--out {self.folder} cannot be made a folder: {err.strerror or err}") from None
        if records.exists() and records.stat().st_size:
            raise ExplorerError(f"{records} already holds a watched run: move it away, or name another --out")
        records.unlink(missing_ok=True)
        context = multiprocessing.get_context("spawn")
        self.lines, self.events = context.Queue(self.settings.queue_size), context.Queue()
        self.process = context.Process(target=run_analysis, name="drift-watch-analysis", daemon=True, args=(
            AnalysisSettings(self.settings.model, self.settings.engine, self.settings.block_size, str(self.folder),
                             RECORDS_NAME), self.lines, self.events))
        self.process.start()
        try:
            self.recorder = Recorder(records, self.lines, self.metrics)
        except OSError as err:
            raise ExplorerError(f"{records} cannot be written: {err.strerror or err}") from None
        self._events_thread = threading.Thread(target=self._read_events, name="drift-watch-events", daemon=True)
        self._events_thread.start()
        self.app = PassThrough(self.settings, self.recorder, self.metrics, self.status)
        return self.app

    def _read_events(self) -> None:
        written = 0.0
        while True:
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                event = None
            except (EOFError, OSError):
                return
            if event is not None:
                kind = event.get("type")
                if kind == "ready":
                    self.analysis_state = "ready"
                elif kind == "fatal":
                    self.analysis_state = f"failed: {event['sentence']}"
                elif kind == "done":
                    self.analysis_state = "done"
                else:
                    self.metrics.observe(event)
            if time.monotonic() - written >= 1.0 or (event is not None and event.get("type") == "done"):
                self.write_status()
                written = time.monotonic()
            if event is not None and event.get("type") == "done":
                return
            if self._stopping.is_set() and self.process is not None and not self.process.is_alive() and event is None:
                return

    def status(self) -> dict[str, Any]:
        recorder = self.recorder
        return {"format": STATUS_FORMAT, **asdict(self.settings), "records": RECORDS_NAME,
                "listening": f"http://{self.settings.host}:{self.settings.port}", "started": self.started,
                "updated": time.time(), "analysis": self.analysis_state,
                "recorded": recorder.lines if recorder else 0, "requests": dict(recorder.outcomes) if recorder else {},
                "dropped": recorder.dropped if recorder else 0,
                "queued": max(self.lines.qsize(), 0) if self.lines is not None else 0}

    def write_status(self) -> None:
        try:
            write_json_atomic(self.folder / STATUS_NAME, self.status())
        except OSError:
            pass  # the folder went away; /watch/state still answers

    def stop(self, timeout_s: float = 600.0) -> None:
        """Write what is pending, let the analysis finish what it was given (up to `timeout_s`), stop it."""
        if self.recorder is not None:
            self.recorder.close()
        self._stopping.set()
        if self.lines is not None:
            try:
                self.lines.put(None, timeout=timeout_s)
            except queue.Full:
                pass
        if self.process is not None:
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(10)
        if self._events_thread is not None:
            self._events_thread.join(timeout_s)
        self.write_status()

    def server(self, sock: socket.socket | None = None) -> Any:
        """A uvicorn server for the app (`start()` first)."""
        import uvicorn

        logging.getLogger("uvicorn.error").addFilter(_QuietCuts())
        config = uvicorn.Config(self.app, host=self.settings.host, port=self.settings.port, lifespan="on",
                                log_level="warning", access_log=False, server_header=False, date_header=False,
                                timeout_keep_alive=75, backlog=4096)
        return uvicorn.Server(config)

    def serve(self, sock: socket.socket | None = None) -> None:
        server = self.server()
        try:
            asyncio.run(server.serve(sockets=[sock] if sock else None))
        finally:
            self.stop()
