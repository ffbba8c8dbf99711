"""One chat exchange as the watch records it: an `openai-jsonl` line (engine/traces/readers.py) that
`python -m engine trace` reads, with the upstream's own bytes beside it.

    {"request": <the client's JSON body>, "response": <the chat.completion: the upstream's JSON, or its stream
     assembled into one>, "watch": {"seq", "outcome", "complete", "stream", "status", "started", "elapsed_ms",
     "request_sha256", "content_encoding", "body" | "body_base64", "error"}}

`watch.body` is what the upstream sent, byte for byte (UTF-8 text when it is, else `body_base64`); `response` is what
the reader takes (for a stream, the `data:` chunks put together as the client library does: content, reasoning and
tool-call arguments concatenated in order, an empty content null, vLLM's `prompt_token_ids` and per-chunk
`token_ids`, the last `usage`).
`request_sha256` is of the bytes the client sent, which were forwarded unchanged. An exchange that did not finish
(`outcome` other than complete: the upstream failed mid-stream, answered an error status or could not be reached,
the client went away, the request body is not a JSON object) is written all the same, with `complete: false`, so
nothing is lost; the reader leaves it out of the analysis.

The proxy only copies bytes: it hands each finished exchange to the watch's recorder process (recorder.py) as a frame
(a JSON head and the two bodies, `exchange_frame`), and there the `Recorder` parses the request, assembles the
stream, writes the line and offers it to the analysis (a bounded queue: when it is full the line is not analysed
live, still written, and counted). No JSON is parsed in the proxy.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

RECORDS_NAME, LIVE_NAME, STATUS_NAME, METRICS_NAME = "records.jsonl", "live.json", "status.json", "metrics.prom"
STATUS_FORMAT = "drift-watch-status/1"
COMPLETE = "complete"
# Why an exchange did not finish: the outcomes other than complete.
OUTCOMES = (COMPLETE, "upstream-failed", "upstream-status", "upstream-unreachable", "client-gone", "unreadable-request")
_FRAME_HEAD = struct.Struct("<III")  # the head's length, the request body's, the response body's


@dataclass
class Exchange:
    """What the proxy saw of one chat request, filled in as it goes (the request body is parsed later, off the
    proxy: `record_of`)."""

    seq: int  # the order requests arrived in
    request_body: bytes
    started: float  # unix time the request arrived
    status: int | None = None
    content_encoding: str | None = None
    body: bytearray = field(default_factory=bytearray)
    outcome: str = COMPLETE
    error: str | None = None
    elapsed_ms: float = 0.0


@dataclass(frozen=True)
class AnalysisSettings:
    """What the proxy tells its recorder process, and that its analysis process (as JSON on their command lines)."""

    model: str
    engine: str | None
    block_size: int
    out_dir: str
    records_name: str
    queue_size: int  # lines waiting for the analysis at most
    analysis_nice: int | None = None  # None: the analysis runs as SCHED_IDLE (live.py: `lowest_priority`)
    session_idle_s: float = 300.0  # a session silent this long is parked (live.py)
    status_base: dict[str, Any] = field(default_factory=dict)  # what status.json says of the watch's settings


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` whole: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    write_bytes_atomic(path, json.dumps(data, ensure_ascii=False).encode("utf-8"))


def exchange_frame(exchange: Exchange) -> list[bytes | bytearray]:
    """The exchange as the pieces of one frame, for one `os.writev`: the bodies are not copied."""
    head = json.dumps([exchange.seq, exchange.started, exchange.status, exchange.content_encoding, exchange.outcome,
                       exchange.error, exchange.elapsed_ms]).encode()
    return [_FRAME_HEAD.pack(len(head), len(exchange.request_body), len(exchange.body)), head, exchange.request_body,
            exchange.body]


def read_frame(stream: IO[bytes]) -> Exchange | None:
    """The next exchange from a stream of frames; None at its end."""
    sizes = stream.read(_FRAME_HEAD.size)
    if len(sizes) < _FRAME_HEAD.size:
        return None
    head_size, request_size, body_size = _FRAME_HEAD.unpack(sizes)
    seq, started, status, encoding, outcome, error, elapsed = json.loads(stream.read(head_size))
    return Exchange(seq, stream.read(request_size), started, status, encoding, bytearray(stream.read(body_size)),
                    outcome, error, elapsed)


class Recorder:
    """The records file's only writer: exchanges in (frames, in the order they ended), each written as its line and
    flushed, then offered to the analysis (`analysis`, a bounded queue of (line number, offset, length): where the
    line is in the file, which its reader reads back, so that a full queue holds no copy of the lines; a full queue
    drops the offer, counted; None at the end). `notify(seq, outcome, offered)` is called per line written."""

    def __init__(self, path: Path, analysis: queue.Queue | None, notify: Callable[[int, str, bool], None]) -> None:
        self.path, self.analysis, self.notify = path, analysis, notify
        self.lines = 0
        self.dropped = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.file = open(path, "ab")  # noqa: SIM115 - closed by `finish`
        self.offset = self.file.tell()

    def write(self, exchange: Exchange) -> None:
        record = record_of(exchange)
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        self.file.write(line)
        self.file.flush()
        offset, self.offset = self.offset, self.offset + len(line)
        self.lines += 1
        outcome = record["watch"]["outcome"]
        self.outcomes[outcome] += 1
        offered = False
        if self.analysis is not None:
            try:
                self.analysis.put_nowait((self.lines, offset, len(line)))
                offered = True
            except queue.Full:
                self.dropped += 1
        self.notify(exchange.seq, outcome, offered)

    def run(self, frames: IO[bytes]) -> None:
        """Every frame until the stream ends, then the file closed and the analysis told (None)."""
        try:
            while (exchange := read_frame(frames)) is not None:
                self.write(exchange)
        finally:
            self.file.close()
            if self.analysis is not None:
                self.analysis.put(None)

    def start(self, frames: IO[bytes]) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(frames,), name="drift-watch-recorder", daemon=True)
        thread.start()
        return thread


def parse_request(body: bytes) -> dict | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _decoded(body: bytes, content_encoding: str | None) -> bytes | None:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding in ("gzip", "deflate"):
        try:
            return zlib.decompress(body, 47)  # 32 + 15: a gzip or zlib header, detected
        except zlib.error:
            return zlib.decompress(body, -15) if encoding == "deflate" else None
    return None  # br, zstd: recorded as bytes, not assembled


def sse_events(body: bytes) -> list[Any]:
    """The JSON values of a server-sent event stream's `data:` events, in order; `[DONE]` and an event cut short at
    the end are left out."""
    text = body.decode("utf-8", errors="replace").replace("\r\n", "\n")
    events = text.split("\n\n")
    if not text.endswith("\n\n"):
        events = events[:-1]  # the last event never ended: the stream was cut inside it
    values = []
    for event in events:
        data = "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
        if not data or data.strip() == "[DONE]":
            continue
        try:
            values.append(json.loads(data))
        except ValueError:
            continue
    return values


def assemble_stream(chunks: list[Any]) -> dict:
    """`chat.completion.chunk` objects put together into the `chat.completion` a non-streamed request returns."""
    response: dict[str, Any] = {"object": "chat.completion"}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None and key not in response:
                response[key] = chunk[key]
        if chunk.get("prompt_token_ids") is not None:
            response["prompt_token_ids"] = chunk["prompt_token_ids"]
        if isinstance(chunk.get("usage"), dict):
            response["usage"] = chunk["usage"]
        for delta_choice in chunk.get("choices") or []:
            if not isinstance(delta_choice, dict):
                continue
            index = delta_choice.get("index", 0)
            choice = choices.setdefault(index, {"index": index, "message": {"role": "assistant"},
                                                "finish_reason": None})
            _merge_delta(choice["message"], delta_choice.get("delta") or {})
            if delta_choice.get("finish_reason") is not None:
                choice["finish_reason"] = delta_choice["finish_reason"]
            if isinstance(delta_choice.get("token_ids"), list):
                choice.setdefault("token_ids", []).extend(delta_choice["token_ids"])
    for choice in choices.values():
        message = choice["message"]
        if not message.get("content"):
            message["content"] = None  # vLLM's first chunk carries content "": a reply of tool calls only has null
        if "tool_calls" in message:
            message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    response["choices"] = [choices[i] for i in sorted(choices)]
    return response


def _merge_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if key == "tool_calls" and isinstance(value, list):
            calls = message.setdefault("tool_calls", {})
            for part in value:
                if not isinstance(part, dict):
                    continue
                call = calls.setdefault(part.get("index", len(calls)), {"id": None, "type": "function",
                                                                         "function": {"name": None, "arguments": ""}})
                for field_name in ("id", "type"):
                    if part.get(field_name):
                        call[field_name] = part[field_name]
                function = part.get("function") or {}
                if function.get("name"):
                    call["function"]["name"] = function["name"]
                if isinstance(function.get("arguments"), str):
                    call["function"]["arguments"] += function["arguments"]
        elif key == "role":
            message["role"] = value or message.get("role")
        elif isinstance(value, str):
            message[key] = (message.get(key) or "") + value
        elif value is not None:
            message[key] = value


def response_of(exchange: Exchange, stream: bool) -> dict | None:
    """The chat.completion the exchange returned, as far as it went (None: nothing readable)."""
    body = _decoded(bytes(exchange.body), exchange.content_encoding)
    if body is None:
        return None
    if stream and exchange.status == 200:
        return assemble_stream(sse_events(body))
    value = parse_request(body)
    return value


def record_of(exchange: Exchange) -> dict[str, Any]:
    request = parse_request(exchange.request_body)
    stream = bool(request and request.get("stream") is True)
    outcome = exchange.outcome
    if request is None and outcome not in ("upstream-unreachable", "upstream-failed"):
        outcome = "unreadable-request"  # what the upstream made of it is in `status` and `body`
    body = bytes(exchange.body)
    watch: dict[str, Any] = {
        "seq": exchange.seq, "outcome": outcome, "complete": outcome == COMPLETE, "stream": stream,
        "status": exchange.status, "started": round(exchange.started, 6), "elapsed_ms": round(exchange.elapsed_ms, 3),
        "request_sha256": hashlib.sha256(exchange.request_body).hexdigest(),
        "content_encoding": exchange.content_encoding, "error": exchange.error,
    }
    try:
        watch["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        watch["body_base64"] = base64.b64encode(body).decode("ascii")
    if request is None:  # an empty request object keeps the line readable as openai-jsonl
        watch["request_body_base64"] = base64.b64encode(exchange.request_body).decode("ascii")
    return {"request": request if request is not None else {}, "response": response_of(exchange, stream) or {},
            "watch": watch}


def upstream_body(record: dict[str, Any]) -> bytes:
    """The bytes the upstream sent, from a record."""
    watch = record["watch"]
    return watch["body"].encode("utf-8") if "body" in watch else base64.b64decode(watch["body_base64"])
