"""The pass-through: an ASGI app (uvicorn, with uvloop and httptools) in front of an OpenAI-compatible upstream.

Every request goes to the upstream as the client sent it: the same method, path, query and body bytes, and the same
headers less the hop-by-hop ones (Host names the upstream; `Expect` is answered by this server, so it is not sent
on). Every response comes back as the upstream sent it: its status, its headers less the hop-by-hop ones, its body as
the bytes arrive (connections.py: httptools' parser on keep-alive connections; nothing decoded or re-encoded). When
the upstream breaks off mid-body, the client's connection is broken off too, as the upstream's would have been; when
the client goes away, the upstream connection is closed (vLLM and SGLang then abort the generation).

The request path is a copy: the body is read whole, written upstream, and each response piece is appended to the
exchange's buffer and sent on; no JSON is parsed. Chat requests (POST {prefix}/chat/completions), when the exchange
ends however it ends, are written as one frame (the bodies are not copied) to the recorder process (recorder.py) by
the event loop itself, on a non-blocking pipe (`FrameSink`): this process runs no other thread, so nothing else
can hold its interpreter when a request needs it. The recorder writes the records line, offers it to the analysis
and keeps the watch's state: `/metrics` serves the metrics it writes (metrics.prom, Prometheus' text format, with
this process' own count of other requests), `/watch/state` the status it writes (status.json).
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import gc
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)

from engine.errors import ExplorerError
from engine.watch.connections import ClientGone, Response, UpstreamBroke, UpstreamPool
from engine.watch.record import (
    LIVE_NAME,
    METRICS_NAME,
    RECORDS_NAME,
    STATUS_FORMAT,
    STATUS_NAME,
    AnalysisSettings,
    Exchange,
    exchange_frame,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1: headers for one connection, not to be forwarded; Host is the upstream's; Expect: 100-continue is
# this server's to answer (uvicorn does, once the body is read), and the upstream gets the body at once.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"transfer-encoding", b"upgrade", b"host", b"proxy-connection", b"expect"})
FRAMES_PIPE_BYTES = 1 << 20  # the pipe to the recorder holds this much before frames wait in the proxy
PROXY_SLICE_NS = 100_000  # the shortest time slice the kernel grants (EEVDF: 0.1 ms)
_SCHED_ATTR_CALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # sched_setattr, sched_getattr


class _SchedAttr(ctypes.Structure):  # struct sched_attr (linux/sched/types.h)
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64),
                ("nice", ctypes.c_int32), ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64), ("util_min", ctypes.c_uint32),
                ("util_max", ctypes.c_uint32)]


def short_slice(slice_ns: int = PROXY_SLICE_NS) -> None:
    """Ask the kernel to run this thread in short slices: on Linux 6.12 and later (EEVDF), a normal task's
    `sched_runtime` is its slice, and a shorter slice is an earlier virtual deadline, so that when a chunk wakes the
    proxy on a busy machine it preempts the running task instead of waiting out that task's slice (1.4 ms here), and
    a burst of its own work is cut more finely in turn. Its share of the CPU is unchanged (the weight, its nice
    level, is kept); no privilege is needed. Older kernels accept the call and keep their own slice; elsewhere
    nothing is asked. /proc/PID/sched shows it (`se.slice`)."""
    calls = _SCHED_ATTR_CALLS.get(platform.machine())
    if calls is None or sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr))
        if libc.syscall(calls[1], 0, ctypes.byref(attr), ctypes.sizeof(_SchedAttr), 0) != 0 or attr.policy != 0:
            return  # not a normal task (someone made it real-time or idle): left as it is
        attr.runtime = slice_ns
        libc.syscall(calls[0], 0, ctypes.byref(attr), 0)
    except (OSError, AttributeError):
        pass


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
    analysis_nice: int | None = None  # None: the analysis is SCHED_IDLE (live.py: lowest_priority)
    session_idle_s: float = 300.0  # a session silent this long is parked by the analysis (live.py)

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


class FrameSink:
    """The proxy's side of the pipe to the recorder process, written by the event loop: each exchange's frame is
    written at once when the pipe has room (`os.writev`, the bodies not copied); what it has no room for waits here,
    in order, and goes when the loop sees the pipe writable. Nothing blocks the loop; nothing is dropped while the
    recorder lives (`pending_bytes` is what waits)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self.pieces: deque[bytes | bytearray | memoryview] = deque()
        self.pending_bytes = 0
        self.waiting = False  # a writer callback is registered
        self.broken = False

    def put(self, exchange: Exchange) -> None:
        if self.broken:
            return
        frame = [piece for piece in exchange_frame(exchange) if piece]  # an empty body is no piece to write
        self.pieces.extend(frame)
        self.pending_bytes += sum(len(piece) for piece in frame)
        if not self.waiting:
            self._write()

    def _write(self) -> None:
        try:
            while self.pieces:
                written = os.writev(self.fd, [self.pieces[i] for i in range(min(len(self.pieces), 64))])
                self.pending_bytes -= written
                while self.pieces and written >= len(self.pieces[0]):
                    written -= len(self.pieces.popleft())
                if written:
                    self.pieces[0] = memoryview(self.pieces[0])[written:]
        except BlockingIOError:
            if not self.waiting:
                asyncio.get_running_loop().add_writer(self.fd, self._write)
                self.waiting = True
            return
        except OSError:  # the recorder is gone: the proxy goes on passing requests through
            self.broken = True
            self.pieces.clear()
            self.pending_bytes = 0
        if self.waiting:
            asyncio.get_running_loop().remove_writer(self.fd)
            self.waiting = False

    def close(self) -> None:
        """What waits, written blocking (the loop is done), then the pipe closed: the recorder's end of frames."""
        os.set_blocking(self.fd, True)
        try:
            while self.pieces and not self.broken:
                written = os.writev(self.fd, [self.pieces[i] for i in range(min(len(self.pieces), 64))])
                while self.pieces and written >= len(self.pieces[0]):
                    written -= len(self.pieces.popleft())
                if written:
                    self.pieces[0] = memoryview(self.pieces[0])[written:]
        except OSError:
            pass
        self.pieces.clear()
        self.pending_bytes = 0
        os.close(self.fd)


class ProxyMetrics:
    """What only the proxy counts (the rest is the recorder's metrics.prom)."""

    def __init__(self, sink: FrameSink) -> None:
        disable_created_metrics()  # no *_created series beside each counter, as the recorder's metrics
        self.registry = CollectorRegistry()
        self.passthrough = Counter("drift_watch_passthrough_requests", "other requests passed through (not "
                                   "recorded)", registry=self.registry)
        Gauge("drift_watch_frames_pending_bytes", "finished exchanges' bytes waiting in the proxy for the recorder",
              registry=self.registry).set_function(lambda: sink.pending_bytes)


class PassThrough:
    """The ASGI app: /metrics, /watch/state, and everything else to the upstream."""

    def __init__(self, settings: WatchSettings, recorder: FrameSink, metrics: ProxyMetrics,
                 status: Callable[[], dict[str, Any]], recorded_metrics: Callable[[], bytes]) -> None:
        self.settings, self.recorder, self.metrics, self.status = settings, recorder, metrics, status
        self.recorded_metrics = recorded_metrics
        self.pool = UpstreamPool(settings.origin)
        self.seq = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/metrics" and scope["method"] == "GET":
                await _respond(send, 200, generate_latest(self.metrics.registry) + self.recorded_metrics(),
                               CONTENT_TYPE_LATEST)
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
            ended = False
            async for piece in upstream.body():
                if record is not None:
                    record.extend(piece)
                # The upstream's last piece and the response's end go to the client as one write when they came
                # together (a stream's `[DONE]` event and the chunked body's end, usually one read).
                ended = upstream.ended_whole()
                await send({"type": "http.response.body", "body": piece, "more_body": not ended})
            if not ended:
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
    """A watch: the records file, the recorder process (which writes it and starts the analysis process), the frame
    sink, the proxy's own metrics and the ASGI app.

    `start()` then the server (`serve()`, or an embedding test's uvicorn), then `stop()`, which hands over every
    exchange still pending and lets the recorder and the analysis finish what they were given."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.folder = Path(settings.out_dir)
        self.started = time.time()
        self.process: subprocess.Popen | None = None
        self.frames: FrameSink | None = None
        self.metrics: ProxyMetrics | None = None
        self.app: PassThrough | None = None

    def start(self) -> PassThrough:
        records = self.folder / RECORDS_NAME
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ExplorerError(f"--out {self.folder} cannot be made a folder: {err.strerror or err}") from None
        if records.exists() and records.stat().st_size:
            raise ExplorerError(f"{records} already holds a watched run: move it away, or name another --out")
        try:
            records.write_bytes(b"")  # the recorder process appends to it
            for name in (STATUS_NAME, LIVE_NAME, METRICS_NAME):  # an earlier run's state is not this one's
                (self.folder / name).unlink(missing_ok=True)
        except OSError as err:
            raise ExplorerError(f"{records} cannot be written: {err.strerror or err}") from None
        frames_read, frames_write = os.pipe()
        try:
            fcntl.fcntl(frames_write, fcntl.F_SETPIPE_SZ, FRAMES_PIPE_BYTES)
        except OSError:
            pass  # the system's default pipe size; frames wait in the sink beyond it
        settings = AnalysisSettings(self.settings.model, self.settings.engine, self.settings.block_size,
                                    str(self.folder), RECORDS_NAME, self.settings.queue_size,
                                    self.settings.analysis_nice, self.settings.session_idle_s, self._base())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                            *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "engine.watch.recorder", json.dumps(asdict(settings)), str(frames_read)],
            pass_fds=(frames_read,), env=env, stdin=subprocess.DEVNULL,
            # A process group of its own: Ctrl-C stops the proxy, which then lets it finish what it was given. Not
            # a session of its own: where the kernel groups tasks by session (autogroup, on in most distributions),
            # a new session is a new group with the same CPU share as the proxy's, whatever the nice level or
            # SCHED_IDLE of the tasks in it, so the recorder and the analysis would take as much CPU as the proxy.
            process_group=0)
        os.close(frames_read)
        self.frames = FrameSink(frames_write)
        self.metrics = ProxyMetrics(self.frames)
        self.app = PassThrough(self.settings, self.frames, self.metrics, self.status, self._recorded_metrics)
        return self.app

    def _base(self) -> dict[str, Any]:
        return {**asdict(self.settings), "listening": f"http://{self.settings.host}:{self.settings.port}",
                "started": self.started}

    def status(self) -> dict[str, Any]:
        """The recorder's status.json (before it wrote one: starting), with what waits in the proxy."""
        try:
            status = json.loads((self.folder / STATUS_NAME).read_bytes())
        except (OSError, ValueError):
            status = {"format": STATUS_FORMAT, **self._base(), "records": RECORDS_NAME, "analysis": "starting",
                      "recorded": 0, "dropped": 0, "analysed": 0, "queued": 0}
        status["frames_pending_bytes"] = self.frames.pending_bytes if self.frames is not None else 0
        return status

    def _recorded_metrics(self) -> bytes:
        try:
            return (self.folder / METRICS_NAME).read_bytes()
        except OSError:
            return b""

    def stop(self, timeout_s: float = 600.0) -> None:
        """Hand over what is pending; let the recorder write it and the analysis analyse it (up to `timeout_s`)."""
        if self.frames is not None:
            self.frames.close()
            self.frames = None
        if self.process is not None:
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self.process.wait(10)

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
        server.config.load()  # uvicorn's protocol and loop modules imported now, before the heap is frozen
        # Started: what is on the heap now (modules, the app) lives as long as the process, and a full collection
        # would walk it all while requests wait; frozen, a collection walks only what requests made.
        gc.collect()
        gc.freeze()
        short_slice()  # this thread only, after the recorder started: its processes keep the kernel's slice
        try:
            server.run()  # on uvicorn's loop: uvloop when it is installed
        finally:
            self.stop()
