"""The pass-through: an ASGI app (uvicorn, with uvloop and httptools) in front of an OpenAI-compatible upstream.

Every request goes to the upstream as the client sent it: the same method, path, query and body bytes, and the same
headers less the hop-by-hop ones (Host names the upstream; `Expect` is answered by this server, so it is not sent
on). Every response comes back as the upstream sent it: its status, its headers less the hop-by-hop ones, its body as
the bytes arrive (connections.py: httptools' parser on keep-alive connections; nothing decoded or re-encoded). When
the upstream breaks off mid-body, the client's connection is broken off too, as the upstream's would have been; when
the client goes away, the upstream connection is closed (vLLM and SGLang then abort the generation).

The request path is a copy: the body is read whole, written upstream, and each response piece is appended to the
exchange's buffer and sent on; no JSON is parsed. Chat requests (POST {prefix}/chat/completions), when the exchange
ends however it ends, are queued to the recorder thread, which writes the exchange as one frame (the bodies are not
copied) to the analysis process (live.py): it writes the records line, offers it to the analysis and tells this
process (the events thread) what it recorded and what the analysis found. `/metrics` is Prometheus' text format;
`/watch/state` the status as JSON (status.json holds the same, rewritten once a second).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.errors import ExplorerError
from engine.watch.connections import ClientGone, Response, UpstreamBroke, UpstreamPool
from engine.watch.metrics import WatchMetrics
from engine.watch.record import (
    OUTCOMES,
    RECORDS_NAME,
    STATUS_NAME,
    AnalysisSettings,
    Exchange,
    exchange_frame,
    write_json_atomic,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1: headers for one connection, not to be forwarded; Host is the upstream's; Expect: 100-continue is
# this server's to answer (uvicorn does, once the body is read), and the upstream gets the body at once.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"transfer-encoding", b"upgrade", b"host", b"proxy-connection", b"expect"})
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


class FrameWriter:
    """The proxy's side of the pipe to the analysis process: exchanges in, in the order they ended, each written as
    one frame by a thread of its own (a slow reader holds this thread, never the event loop)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="drift-watch-frames", daemon=True)
        self.thread.start()

    def put(self, exchange: Exchange) -> None:
        self.pending.put(exchange)

    def _run(self) -> None:
        broken = False
        while (exchange := self.pending.get()) is not None:
            if broken:
                continue
            pieces = exchange_frame(exchange)
            try:
                while pieces:
                    written = os.writev(self.fd, pieces)
                    while pieces and written >= len(pieces[0]):
                        written -= len(pieces[0])
                        pieces.pop(0)
                    if pieces and written:
                        pieces[0] = memoryview(pieces[0])[written:]
            except OSError:  # the analysis process is gone: the proxy goes on passing requests through
                broken = True
        os.close(self.fd)

    def close(self) -> None:
        self.pending.put(None)
        self.thread.join()


class PassThrough:
    """The ASGI app: /metrics, /watch/state, and everything else to the upstream."""

    def __init__(self, settings: WatchSettings, recorder: FrameWriter, metrics: WatchMetrics,
                 status: Callable[[], dict[str, Any]]) -> None:
        self.settings, self.recorder, self.metrics, self.status = settings, recorder, metrics, status
        self.pool = UpstreamPool(settings.origin)
        self.seq = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/metrics" and scope["method"] == "GET":
                await _respond(send, 200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/watch/state" and scope["method"] == "GET":
                await _respond(send, 200, json.dumps(self.status()).encode(), "application/json")
            else:
                await self._forward(scope, receive, send, path == self.settings.chat_path and
                                    scope["method"] == "POST")
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send, recorded: bool) -> None:
        started, clock = time.time(), time.perf_counter()
        message = await receive()
        body = message.get("body", b"")
        if message.get("more_body"):
            chunks = [body]
            while message.get("more_body"):
                message = await receive()
                chunks.append(message.get("body", b""))
            body = b"".join(chunks)
        if message["type"] == "http.disconnect":
            return  # gone before its request was whole: nothing was sent upstream
        exchange = None
        if recorded:
            self.seq += 1
            exchange = Exchange(self.seq, body, started)
        else:
            self.metrics.passthrough.inc()
        target = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").split("?", 1)[0]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        try:
            upstream = await self.pool.request(scope["method"], target, headers, body)
        except (TimeoutError, OSError, UpstreamBroke) as err:
            if exchange is not None:
                exchange.outcome, exchange.error = "upstream-unreachable", f"{type(err).__name__}: {err}"
                exchange.elapsed_ms = (time.perf_counter() - clock) * 1000
                self.recorder.put(exchange)
            await _respond(send, 502, json.dumps({"error": {
                "message": f"the drift watch could not reach the upstream {self.settings.origin} "
                           f"({type(err).__name__})", "type": "upstream_unreachable"}}).encode(), "application/json")
            return
        if exchange is not None:
            exchange.status = upstream.status
            exchange.content_encoding = next((v.decode("latin-1") for k, v in upstream.headers
                                              if k.lower() == b"content-encoding"), None)
            if upstream.status != 200:
                exchange.outcome = "upstream-status"
        cut: Exception | None = None
        try:
            cut = await self._stream_back(upstream, exchange, receive, send)
        finally:
            upstream.release()
            if exchange is not None:
                exchange.elapsed_ms = (time.perf_counter() - clock) * 1000
                self.recorder.put(exchange)
        if cut is not None:
            raise UpstreamCut(str(cut)) from cut

    async def _stream_back(self, upstream: Response, exchange: Exchange | None, receive: Receive,
                           send: Send) -> Exception | None:
        """The upstream's response to the client, piece by piece; the upstream's error when it broke off. A task
        beside it waits for the client to go away, and then ends the upstream response (`ClientGone`)."""
        headers = [(k, v) for k, v in upstream.headers if k.lower() not in HOP_BY_HOP]
        record = exchange.body if exchange is not None else None

        async def client_gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            upstream.fail(ClientGone())  # (uvicorn also says disconnect once the response is complete: no effect)

        watcher = asyncio.ensure_future(client_gone())
        try:
            await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
            async for piece in upstream.body():
                if record is not None:
                    record.extend(piece)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except UpstreamBroke as err:
            if exchange is not None:
                exchange.outcome, exchange.error = "upstream-failed", f"{type(err).__name__}: {err}"
            return err
        except (ClientGone, OSError):  # OSError: uvicorn's ClientDisconnected, the client went away as we sent
            if exchange is not None and exchange.outcome in ("complete", "upstream-status"):
                exchange.outcome = "client-gone"
        finally:
            watcher.cancel()
        return None


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Watch:
    """A watch: the records file, the analysis process (which writes it), the frame writer, the metrics and the ASGI
    app.

    `start()` then the server (`serve()`, or an embedding test's uvicorn), then `stop()`, which hands over every
    exchange still pending and lets the analysis process write and analyse what it was given."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.folder = Path(settings.out_dir)
        self.metrics = WatchMetrics(settings.model, settings.engine, settings.upstream)
        self.analysis_state = "starting"
        self.started = time.time()
        self.process: subprocess.Popen | None = None
        self.frames: FrameWriter | None = None
        self.app: PassThrough | None = None
        self.recorded = 0
        self.offered = 0  # lines the analysis was given
        self.dropped = 0
        self.processed = 0  # lines the analysis has been through (analysed, refused, or not a complete exchange)
        self.analysed = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self._events_thread: threading.Thread | None = None

    def start(self) -> PassThrough:
        records = self.folder / RECORDS_NAME
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ExplorerError(f"--out {self.folder} cannot be made a folder: {err.strerror or err}") from None
        if records.exists() and records.stat().st_size:
            raise ExplorerError(f"{records} already holds a watched run: move it away, or name another --out")
        try:
            records.write_bytes(b"")  # the analysis process appends to it
        except OSError as err:
            raise ExplorerError(f"{records} cannot be written: {err.strerror or err}") from None
        frames_read, frames_write = os.pipe()
        events_read, events_write = os.pipe()
        settings = AnalysisSettings(self.settings.model, self.settings.engine, self.settings.block_size,
                                    str(self.folder), RECORDS_NAME, self.settings.queue_size)
        # Its own interpreter: no tokenization or render ever holds the proxy's. One tokenizer thread (the proxy
        # keeps the other core).
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                              *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "engine.watch.live", json.dumps(asdict(settings)), str(frames_read),
             str(events_write)], pass_fds=(frames_read, events_write), env=env, stdin=subprocess.DEVNULL,
            start_new_session=True)  # Ctrl-C stops the proxy, which then lets it finish what it was given
        os.close(frames_read)
        os.close(events_write)
        self.frames = FrameWriter(frames_write)
        self._events_thread = threading.Thread(target=self._read_events, args=(events_read,),
                                               name="drift-watch-events", daemon=True)
        self._events_thread.start()
        self.app = PassThrough(self.settings, self.frames, self.metrics, self.status)
        return self.app

    def _read_events(self, fd: int) -> None:
        """The analysis process' events until it ends; status.json rewritten once a second meanwhile."""
        written, pending = 0.0, b""
        while True:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    self._event(json.loads(line))
            if time.monotonic() - written >= 1.0:
                self.write_status()
                written = time.monotonic()
        os.close(fd)
        if self.analysis_state in ("starting", "ready"):
            self.analysis_state = "done" if self.process and self.process.poll() == 0 else "stopped"
        self.write_status()

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "recorded":
            self.recorded += 1
            self.outcomes[event["outcome"]] += 1
            self.metrics.requests.labels(event["outcome"]).inc()
            if event["offered"]:
                self.offered += 1
            elif self.analysis_state == "ready":
                self.dropped += 1
                self.metrics.dropped.inc()
        elif kind == "ready":
            self.analysis_state = "ready"
        elif kind == "fatal":
            self.analysis_state = f"failed: {event['sentence']}"
        elif kind == "done":
            self.analysis_state = "done"
        else:  # span, error, skipped: one line the analysis has been through
            self.processed += 1
            self.analysed += kind == "span"
            self.metrics.observe(event)
        self.metrics.queued.set(self.offered - self.processed)

    def status(self) -> dict[str, Any]:
        return {"format": STATUS_FORMAT, **asdict(self.settings), "records": RECORDS_NAME,
                "listening": f"http://{self.settings.host}:{self.settings.port}", "started": self.started,
                "updated": time.time(), "analysis": self.analysis_state, "recorded": self.recorded,
                "requests": dict(self.outcomes), "dropped": self.dropped, "analysed": self.analysed,
                "queued": self.offered - self.processed, "pids": {
                    "proxy": os.getpid(), "analysis": self.process.pid if self.process else None}}

    def write_status(self) -> None:
        try:
            write_json_atomic(self.folder / STATUS_NAME, self.status())
        except OSError:
            pass  # the folder went away; /watch/state still answers

    def stop(self, timeout_s: float = 600.0) -> None:
        """Hand over what is pending, let the analysis process write and analyse it (up to `timeout_s`), stop it."""
        if self.frames is not None:
            self.frames.close()
        if self.process is not None:
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self.process.wait(10)
        if self._events_thread is not None:
            self._events_thread.join(timeout_s)
        self.write_status()

    def server(self) -> Any:
        """A uvicorn server for the app (`start()` first): uvloop and httptools when they are installed."""
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                # uvicorn raises a signal that stopped it again once it has stopped, which would end this process
                # before `stop()` hands the analysis process what is pending: the signal is handled here.
                super().handle_exit(sig, frame)
                self._captured_signals.clear()

        logging.getLogger("uvicorn.error").addFilter(_QuietCuts())
        config = uvicorn.Config(self.app, host=self.settings.host, port=self.settings.port, lifespan="on",
                                log_level="warning", access_log=False, server_header=False, date_header=False,
                                timeout_keep_alive=75, backlog=4096, proxy_headers=False)
        return Server(config)

    def serve(self) -> None:
        server = self.server()
        try:
            server.run()  # on uvicorn's loop: uvloop when it is installed
        finally:
            self.stop()
