"""The proxy's HTTP/1.1 connections to the upstream: a keep-alive pool of asyncio connections whose responses are
read by httptools' parser (llhttp, in C: the same parser uvicorn serves with), so that a streamed chunk costs the
proxy a parser callback and a list append, not an HTTP library's Python layers.

A request goes out as one write: the request line, the client's headers as they came (less the hop-by-hop ones,
which the caller removes), a Host naming the upstream, and the body bytes. The response comes back as its status,
its raw headers, then its body in the pieces the socket delivered, after the transfer coding is removed (what the
upstream's application sent, byte for byte, which the proxy's server frames again for the client). An upstream
that breaks off mid-body raises `UpstreamBroke`; a pooled connection the upstream closed while idle is not used.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # bytes read ahead of a slow client before the upstream socket is paused
CONNECT_TIMEOUT_S = 30.0


class UpstreamBroke(Exception):
    """The upstream's connection ended before its response did (or it sent what is not HTTP)."""


class ClientGone(Exception):
    """The proxy's client went away: the response it was reading is given up (its connection closed)."""


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.parser: Any = None
        self.response: Response | None = None

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing asked: an idle connection that speaks out of turn is not reused
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            response.fail(UpstreamBroke(f"the upstream's response is not HTTP/1.1 ({err})"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if response.status and response.until_close:
                response.finish()  # a body delimited by the connection's end
            else:
                response.fail(UpstreamBroke(f"the upstream closed the connection mid-response ({exc or 'EOF'})"))

    # httptools
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        response.status = self.parser.get_status_code()
        # Asked now: once the message is complete the parser is reset for the next one, and says False.
        response.keep_alive = self.parser.should_keep_alive()
        names = {name.lower() for name, _ in response.headers}
        response.until_close = b"content-length" not in names and b"transfer-encoding" not in names and \
            response.status >= 200 and response.status not in (204, 304)
        response.wake()
        if response.head_only or response.status in (204, 304):
            response.finish()

    def on_body(self, body: bytes) -> None:
        response = self.response
        assert response is not None
        response.chunks.append(body)
        response.buffered += len(body)
        if response.buffered > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            response.paused = True
        response.wake()

    def on_message_complete(self) -> None:
        if self.response is not None and not self.response.complete:
            self.response.finish()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """One upstream response as it arrives: `await started()` for its status and headers, `body()` for its pieces,
    `release()` when done with it (the connection goes back to the pool only when the response ended whole)."""

    def __init__(self, connection: _Connection, head_only: bool) -> None:
        self.connection, self.head_only = connection, head_only
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.until_close = False
        self.keep_alive = False  # the upstream's answer lets the connection carry another request
        self.complete = False
        self.error: Exception | None = None
        self._waiter: asyncio.Future | None = None

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def finish(self) -> None:
        self.complete = True
        self.wake()

    def fail(self, error: Exception) -> None:
        self.error = self.error or error
        self.wake()

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def started(self) -> None:
        while not self.status:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def body(self) -> AsyncIterator[bytes]:
        """The body's pieces; what arrived while the client was being written to comes as one piece."""
        while True:
            if self.chunks:
                piece = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
                self.chunks.clear()
                self.buffered = 0
                if self.paused and self.connection.transport is not None:
                    self.paused = False
                    self.connection.transport.resume_reading()
                yield piece
                continue
            if self.error is not None and (not self.complete or isinstance(self.error, ClientGone)):
                raise self.error
            if self.complete:
                return
            await self._wait()

    def ended_whole(self) -> bool:
        """Every piece given out and the response complete, with no error: what `body()` yields next is its end."""
        return self.complete and self.error is None and not self.chunks

    def release(self) -> None:
        connection = self.connection
        connection.response = None
        if self.complete and self.error is None and self.keep_alive and not self.until_close and not connection.closed:
            connection.pool.idle.append(connection)
        else:
            connection.close()  # cut short, or not reusable: the upstream sees the connection end (and aborts)


class UpstreamPool:
    """Keep-alive connections to one origin (http or https), without a limit: 200 concurrent streams are 200
    connections, none of them waiting for another."""

    def __init__(self, origin: str) -> None:
        parts = urlsplit(origin)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.encode("latin-1")
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.idle: deque[_Connection] = deque()

    async def _connection(self) -> tuple[_Connection, bool]:
        while self.idle:
            connection = self.idle.pop()  # the most recently used: the least likely to have timed out
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                return connection, True
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(loop.create_connection(
            lambda: _Connection(self), self.host, self.port, ssl=self.ssl,
            server_hostname=self.host if self.ssl else None), CONNECT_TIMEOUT_S)
        return connection, False

    async def request(self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
        """Send the request; the response once its status and headers are in."""
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), b"host: " + self.host_header + b"\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        if body and not any(name.lower() == b"content-length" for name, _ in headers):
            head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        data = b"".join(head) + b"\r\n" + body
        for attempt in (1, 2):
            connection, reused = await self._connection()
            response = Response(connection, method == "HEAD")
            connection.response = response
            connection.parser = httptools.HttpResponseParser(connection)
            assert connection.transport is not None
            connection.transport.write(data)
            try:
                await response.started()
            except UpstreamBroke:
                response.release()
                # a kept-alive connection the upstream closed as we wrote: once more on a new one
                if reused and attempt == 1 and not response.headers:
                    continue
                raise
            return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()
