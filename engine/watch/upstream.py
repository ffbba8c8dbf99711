"""A real local OpenAI-compatible upstream (an ASGI app, under uvicorn) that answers chat requests with recorded
completions: the responses of an openai-jsonl trace (samples/traces/openai.jsonl: our simulator's sessions as vLLM
0.33.0 returns them with return_token_ids), looked up by the request's messages and tools. For the watch's tests
and its benchmark.

A non-streamed request gets the recorded response as JSON; a streamed one (`"stream": true`) gets it as vLLM streams
it: server-sent `chat.completion.chunk` events (the role and `prompt_token_ids` first, then the reasoning, the
content and each tool call in pieces with their share of `token_ids`, the finish reason, `usage` when
`stream_options.include_usage` asks, then `data: [DONE]`). `first_token_s` and `chunk_gap_s` pace them as a
generating server does; `token_s` instead paces each chunk by the tokens it carries (its share of the recorded
`token_ids`, at least one), as a server that decodes a token every `token_s` and streams what each step made. The
pace is a schedule from the request's arrival, as a server's decode steps are: a chunk this process sent late does
not push the later ones back, so its own lateness on a busy machine does not add up along a stream (the bench sends
each request twice, straight and through the watch, and compares the two streams).
With `cache_blocks`, `usage.prompt_tokens_details.cached_tokens` is what a block prefix
cache of that many blocks (least recently used evicted, block keys chained as vLLM's) holds of the prompt, short of
its last token, every served sequence (prompt + completion) cached.

Faults, asked by request headers (which the watch forwards unchanged): `x-replay-fail-after: N` breaks the
connection after N chunks (a stream) or N bytes (JSON); `x-replay-status: 503` answers that status;
`x-replay-chunk-gap: S` paces this stream's chunks S seconds apart; `x-replay-evict: 1` empties the prefix cache
first (a restarted or preempted server). `sent` keeps, per request, the body bytes received and the bytes sent, in
order, and whether the response was sent whole.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError

CHUNK_CHARS = 24


@dataclass
class Sent:
    request: bytes
    response: bytearray = field(default_factory=bytearray)
    finished: bool = False


def request_key(request: dict[str, Any]) -> str:
    return json.dumps([request.get("messages"), request.get("tools") or None], sort_keys=True, ensure_ascii=False)


def load_completions(path: str | Path) -> dict[str, dict[str, Any]]:
    """Recorded responses by request (messages and tools), from an openai-jsonl file."""
    completions: dict[str, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            completions.setdefault(request_key(record["request"]), record["response"])
    if not completions:
        raise ExplorerError(f"{path} holds no recorded completion")
    return completions


class PrefixCache:
    """Block keys chained over the tokens (vLLM's), least recently used evicted past `blocks`."""

    def __init__(self, blocks: int, block_size: int = 16) -> None:
        self.blocks, self.block_size = blocks, block_size
        self.keys: OrderedDict[int, None] = OrderedDict()

    def _chain(self, ids: list[int]) -> Iterator[int]:
        h = 0
        for start in range(0, len(ids) - self.block_size + 1, self.block_size):
            h = hash((h, tuple(ids[start:start + self.block_size])))
            yield h

    def cached(self, prompt: list[int]) -> int:
        hits = 0
        for h in self._chain(prompt[:-1]):  # the last prompt token is always computed
            if h not in self.keys:
                break
            self.keys.move_to_end(h)
            hits += self.block_size
        return hits

    def add(self, sequence: list[int]) -> None:
        for h in self._chain(sequence):
            self.keys[h] = None
            self.keys.move_to_end(h)
        while len(self.keys) > self.blocks:
            self.keys.popitem(last=False)


def decode_steps(chunk: dict[str, Any]) -> int:
    """How many decode steps a streamed chunk stands for: its tokens, at least one; none for the usage chunk."""
    choices = chunk.get("choices")
    return max(1, len(choices[0].get("token_ids") or [])) if choices else 0


def stream_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A chat.completion as vLLM streams it, chunk by chunk."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    base = {"id": response.get("id"), "object": "chat.completion.chunk", "created": response.get("created"),
            "model": response.get("model")}
    pieces: list[dict[str, Any]] = []
    for key in ("reasoning_content", "reasoning", "content"):
        text = message.get(key)
        if isinstance(text, str) and text:
            pieces += [{key: text[i:i + CHUNK_CHARS]} for i in range(0, len(text), CHUNK_CHARS)]
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"].get("arguments") or ""
        half = len(arguments) // 2
        pieces.append({"tool_calls": [{"index": index, "id": call.get("id"), "type": "function",
                                       "function": {"name": call["function"]["name"], "arguments": arguments[:half]}}]})
        pieces.append({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    token_ids = choice.get("token_ids")
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None, **({"token_ids": []} if token_ids is not None else {})}],
               **({"prompt_token_ids": response["prompt_token_ids"]} if "prompt_token_ids" in response else {})}]
    for n, delta in enumerate(pieces):
        share = None
        if token_ids is not None:  # the ids spread over the pieces in order
            share = token_ids[len(token_ids) * n // len(pieces):len(token_ids) * (n + 1) // len(pieces)]
        chunks.append({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                                            **({"token_ids": share} if share is not None else {})}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": choice.get("finish_reason"),
                                        **({"token_ids": [] if pieces else token_ids} if token_ids is not None
                                           else {})}]})
    if include_usage and response.get("usage"):
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks


class ReplayUpstream:
    """The ASGI app."""

    def __init__(self, completions: dict[str, dict[str, Any]], *, first_token_s: float = 0.0,
                 chunk_gap_s: float = 0.0, token_s: float = 0.0, cache_blocks: int | None = None,
                 block_size: int = 16) -> None:
        self.completions = completions
        self.first_token_s, self.chunk_gap_s, self.token_s = first_token_s, chunk_gap_s, token_s
        self.cache = PrefixCache(cache_blocks, block_size) if cache_blocks is not None else None
        self.sent: list[Sent] = []
        self.served = 0
        self._streams: dict[tuple[int, bool], tuple[list[bytes], list[int]]] = {}  # a recording's events, once

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        sent = Sent(body)
        self.sent.append(sent)
        if scope["path"].endswith("/models"):
            await self._whole(send, sent, 200, json.dumps({"object": "list", "data": []}).encode(), None)
            return
        try:
            request = json.loads(body)
            response = self.completions[request_key(request)]
        except (ValueError, KeyError, TypeError, AttributeError):
            await self._whole(send, sent, 404, json.dumps({"error": {"message": "no recorded completion for this "
                                                                     "request", "type": "not_found"}}).encode(), None)
            return
        status = int(headers.get("x-replay-status", "200"))
        fail_after = int(headers["x-replay-fail-after"]) if "x-replay-fail-after" in headers else None
        if status != 200:
            await self._whole(send, sent, status, json.dumps({"error": {"message": "asked to fail",
                                                                        "type": "server_error"}}).encode(), None)
            return
        if headers.get("x-replay-evict") == "1" and self.cache is not None:
            self.cache.keys.clear()
        gap = float(headers.get("x-replay-chunk-gap", self.chunk_gap_s))
        response = self._with_cache(response)
        self.served += 1
        loop = asyncio.get_running_loop()
        due = loop.time() + self.first_token_s  # the schedule, from the request's arrival
        if self.first_token_s:
            await asyncio.sleep(self.first_token_s)
        if request.get("stream") is True:
            events, steps = self._stream(response, bool((request.get("stream_options") or {}).get("include_usage")))
            if self.token_s and "x-replay-chunk-gap" not in headers:
                gaps = [self.token_s * n for n in steps]
            else:
                gaps = [gap] * len(events)
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
            for n, event in enumerate(events):
                if fail_after is not None and n == fail_after:
                    raise ConnectionAbortedError("asked to fail mid-stream")
                if gaps[n] and n:
                    due += gaps[n]  # a late chunk does not push the later ones back
                    if due > loop.time():
                        await asyncio.sleep(due - loop.time())
                try:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                except OSError:  # the client (the watch) went away: stop generating, as vLLM aborts the request
                    return
                sent.response += event
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            sent.finished = True
            return
        await self._whole(send, sent, 200, json.dumps(response, ensure_ascii=False).encode(), fail_after)

    def _stream(self, response: dict[str, Any], include_usage: bool) -> tuple[list[bytes], list[int]]:
        """The response's server-sent events and each one's decode steps (encoded once per recording when no cache
        figure makes each answer differ)."""
        key = (id(response), include_usage)
        if key not in self._streams:
            chunks = stream_chunks(response, include_usage)
            events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode() for c in chunks]
            value = (events + [b"data: [DONE]\n\n"], [decode_steps(c) for c in chunks] + [0])
            if self.cache is not None:
                return value
            self._streams[key] = value
        return self._streams[key]

    def _with_cache(self, response: dict[str, Any]) -> dict[str, Any]:
        if self.cache is None or response.get("prompt_token_ids") is None:
            return response
        prompt = list(response["prompt_token_ids"])
        cached = self.cache.cached(prompt)
        self.cache.add(prompt + list(response["choices"][0].get("token_ids") or []))
        usage = {**(response.get("usage") or {}), "prompt_tokens_details": {"cached_tokens": cached}}
        return {**response, "usage": usage}

    async def _whole(self, send: Any, sent: Sent, status: int, body: bytes, fail_after: int | None) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        if fail_after is not None:
            sent.response += body[:fail_after]
            await send({"type": "http.response.body", "body": body[:fail_after], "more_body": True})
            raise ConnectionAbortedError("asked to fail mid-body")
        sent.response += body
        await send({"type": "http.response.body", "body": body, "more_body": False})
        sent.finished = True


def serve_upstream(records: str, host: str, port: int, first_token_s: float = 0.0, chunk_gap_s: float = 0.0,
                   cache_blocks: int | None = None, token_s: float = 0.0) -> None:
    """Run the upstream in this process until it is stopped (the benchmark starts it as a process of its own)."""
    import uvicorn

    app = ReplayUpstream(load_completions(records), first_token_s=first_token_s, chunk_gap_s=chunk_gap_s,
                         token_s=token_s, cache_blocks=cache_blocks)
    uvicorn.run(app, host=host, port=port, log_level="error", access_log=False, lifespan="on", backlog=4096,
                timeout_keep_alive=75)


def recorded_sessions(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The requests of an openai-jsonl trace by session, in order: what its clients sent."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            record = json.loads(line)
            sessions.setdefault(str(record.get("session_id") or f"line {n}"), []).append(record["request"])
    return sessions


def session_request(request: dict[str, Any], user: str, stream: bool) -> bytes:
    """A recorded request as a client of the watch sends it: its session's id in `session_id` (a body field the
    trace readers group by; engine/traces/grouping.py) and in OpenAI's `user`, streamed or not, with usage in the
    stream."""
    body = {**request, "user": user, "session_id": user, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, ensure_ascii=False).encode()


if __name__ == "__main__":  # the bench's upstream: python -m engine.watch.upstream RECORDS PORT TTFT_S TOKEN_S
    import sys

    serve_upstream(sys.argv[1], "127.0.0.1", int(sys.argv[2]), first_token_s=float(sys.argv[3]),
                   token_s=float(sys.argv[4]))
