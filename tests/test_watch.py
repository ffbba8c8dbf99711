"""`python -m engine watch` in front of a real local upstream: both are uvicorn servers on real sockets (the upstream
answers with the recorded completions of samples/traces/openai.jsonl, streamed and not), the analysis is the watch's
own process. Clients run the samples' sessions concurrently, and meet an upstream that fails mid-stream, that answers
an error, that evicts its cache, and go away mid-stream themselves.

Checked: every exchange is in the records once, in its session's order, its bytes what the upstream sent and what
the client got; the request bytes the upstream got are the client's; `trace` on the records gives the live state's
sessions and breaks; the metrics count what the live state holds. Every wait is on a condition, bounded generously
for a loaded machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import queue
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from engine.traces.report import ParkedSessions, analyse_trace
from engine.watch.live import LiveAnalysis, read_watch
from engine.watch.proxy import Watch, WatchSettings
from engine.watch.record import Exchange, Recorder, exchange_frame, upstream_body
from engine.watch.recorder import _send_lines
from engine.watch.upstream import ReplayUpstream, load_completions, recorded_sessions, session_request

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "traces" / "openai.jsonl"
BOUND_S = 600  # a bound for a hang, not a speed: the analysis process loads the model and replays every break
# What each sample session's break is (tests/test_traces.py pins the same from the file): kind of its cause.
SAMPLE_CAUSES = {"tool-call-1": None, "next-user-turn-2": "reasoning-dropped", "args-serialization-3":
                 "args-type-coerced", "client-drops-reasoning-4": "client-dropped-field",
                 "noncanonical-tokens-5": "retokenised"}
COPIES = 3  # of each sample session, streamed and not: 30 sessions at once


def wait_until(predicate, what: str, bound_s: float = BOUND_S, every_s: float = 0.05):
    deadline = time.monotonic() + bound_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {bound_s} s for {what}")
        time.sleep(every_s)


def serve(app, config: dict | None = None) -> tuple[uvicorn.Server, threading.Thread, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False,
                                           **(config or {})))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "a server to start")
    return server, thread, sock.getsockname()[1]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    upstream = ReplayUpstream(load_completions(SAMPLE), cache_blocks=4096)
    up_server, up_thread, up_port = serve(upstream)
    out = tmp_path_factory.mktemp("watch")
    # The analysis at nice 10, not the default SCHED_IDLE: with other jobs keeping both cores busy, an idle-class
    # analysis would wait for them all (test_the_analysis_runs_at_the_lowest_priority checks the default).
    watch = Watch(WatchSettings(f"http://127.0.0.1:{up_port}/v1", "qwen3.5", "vllm@0.33.0", out_dir=str(out),
                                analysis_nice=10))
    watch.start()
    server = watch.server()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the watch to start")
    base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    yield {"watch": watch, "upstream": upstream, "base": base, "out": out}
    server.should_exit = True
    thread.join(60)
    watch.stop()
    up_server.should_exit = True
    up_thread.join(60)


def recorded(watch: Watch) -> int:
    return watch.status()["recorded"]


def metric_values(base: str) -> dict[tuple[str, tuple], float]:
    """The watch's /metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=BOUND_S).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines()]


async def play(base: str, sessions: dict[str, list[dict]]) -> dict[str, list[bytes]]:
    """Every session at once, each request after the previous one's answer; what each client received."""
    got: dict[str, list[bytes]] = {}
    async with httpx.AsyncClient(timeout=BOUND_S, limits=httpx.Limits(max_connections=None)) as client:
        async def one(user: str, requests: list[dict], stream: bool) -> None:
            for request in requests:
                response = await client.post(f"{base}/chat/completions", content=session_request(request, user,
                                                                                                  stream),
                                             headers={"content-type": "application/json"})
                assert response.status_code == 200, response.text
                got.setdefault(user, []).append(response.content)

        await asyncio.gather(*(one(f"{name}/{copy}/{'stream' if stream else 'json'}", requests, stream)
                               for name, requests in sessions.items() for copy in range(COPIES)
                               for stream in (False, True)))
    return got


@pytest.fixture(scope="module")
def played(running):
    sessions = recorded_sessions(SAMPLE)
    got = asyncio.run(play(running["base"], sessions))
    total = sum(len(v) for v in got.values())
    wait_until(lambda: recorded(running["watch"]) >= total, "every exchange to be recorded")
    return {**running, "got": got, "sessions": sessions, "total": total}


def test_every_exchange_is_recorded_once_in_its_sessions_order_byte_for_byte(played):
    got, upstream = played["got"], played["upstream"]
    lines = records(played["out"])
    assert len(lines) == played["total"] == sum(len(v) for v in played["sessions"].values()) * COPIES * 2
    assert Counter(r["watch"]["outcome"] for r in lines) == {"complete": played["total"]}
    sent_by_request = {s.request: s for s in upstream.sent}
    by_user: dict[str, list[dict]] = {}
    for record in lines:
        by_user.setdefault(record["request"]["user"], []).append(record)
    assert set(by_user) == set(got)
    for user, mine in by_user.items():
        name, _, kind = user.split("/")
        expected = [session_request(r, user, kind == "stream") for r in played["sessions"][name]]
        # the requests, in the order the client sent them; each forwarded unchanged (the upstream got its bytes)
        assert [r["watch"]["request_sha256"] for r in mine] == [hashlib.sha256(b).hexdigest() for b in expected]
        assert [r["watch"]["seq"] for r in mine] == sorted(r["watch"]["seq"] for r in mine)
        for body, record, received in zip(expected, mine, got[user]):
            sent = sent_by_request[body]
            assert sent.finished
            # what the upstream sent == what the watch recorded == what the client received, byte for byte
            assert upstream_body(record) == bytes(sent.response) == received
            assert record["watch"]["stream"] is (kind == "stream")
    assert sorted(r["watch"]["seq"] for r in lines) == list(range(1, played["total"] + 1))


def test_a_streamed_exchange_is_read_as_the_same_completion(played):
    """The stream's chunks put together give what the non-streamed request returns: message, ids, usage."""
    lines = records(played["out"])
    plain = {(r["request"]["user"].split("/")[0], json.dumps(r["request"]["messages"])): r["response"]
             for r in lines if not r["watch"]["stream"]}
    for record in (r for r in lines if r["watch"]["stream"]):
        twin = plain[(record["request"]["user"].split("/")[0], json.dumps(record["request"]["messages"]))]
        assembled = record["response"]
        assert assembled["prompt_token_ids"] == twin["prompt_token_ids"]
        assert assembled["choices"][0]["token_ids"] == twin["choices"][0]["token_ids"]
        assert assembled["choices"][0]["finish_reason"] == twin["choices"][0]["finish_reason"]
        message, expected = assembled["choices"][0]["message"], twin["choices"][0]["message"]
        assert {k: message.get(k) for k in ("role", "content", "reasoning_content", "tool_calls")} == \
               {k: expected.get(k) for k in ("role", "content", "reasoning_content", "tool_calls")}
        assert assembled["usage"]["prompt_tokens"] == twin["usage"]["prompt_tokens"]


def test_trace_on_the_records_gives_the_live_sessions_and_breaks(played, qwen35):
    watch = played["watch"]
    wait_until(lambda: read_watch(played["out"]).live.get("analysed") == played["total"],
               "the live analysis to catch up")
    live = read_watch(played["out"])
    assert watch.status()["dropped"] == 0 and live.live["incomplete"] == 0 and live.live["errors"] == []
    report = analyse_trace(played["out"] / "records.jsonl", qwen35, engine="vllm@0.33.0")
    assert report.to_json() == live.report
    # each session's break and cause as the sample's
    assert len(live.report["sessions"]) == len(played["got"])
    for session in live.report["sessions"]:
        kinds = [r["cause"]["kind"] for r in session["requests"] if r["breaks"]]
        expected = SAMPLE_CAUSES[session["key"].split("/")[0]]
        assert kinds == ([expected] if expected else []), session["key"]
    # the metrics count what the live state holds
    base = played["base"]
    wait_until(lambda: metric_values(base)[("drift_watch_analysed_requests_total", ())] == played["total"],
               "the metrics to catch up")
    metrics = metric_values(base)
    assert metrics[("drift_watch_sessions_total", ())] == len(live.report["sessions"])
    breaks = Counter(b["cause"]["kind"] for b in live.breaks())
    counted = Counter()
    for (name, labels), value in metrics.items():
        if name == "drift_watch_breaks_total":
            counted[dict(labels)["kind"]] += int(value)
    assert counted == breaks and sum(breaks.values()) == 4 * COPIES * 2
    reused = sum(r["reused_tokens"] for s in live.report["sessions"] for r in s["requests"])
    assert metrics[("drift_watch_reused_tokens_total", ())] == reused
    text = httpx.get(base.removesuffix("/v1") + "/metrics").text
    assert 'drift_watch_breaks_total{kind="reasoning-dropped",location="Qwen-Qwen3.5-0.8B.jinja:100-103",' \
           f'stage="template"}} {2.0 * COPIES}' in text
    assert f"drift_watch_analysed_requests_total {float(played['total'])}" in text
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names)) and "drift_watch_passthrough_requests_total" in names  # the proxy's too
    assert not [name for name in names if name.endswith("_created")]


def test_measured_and_predicted_reuse_side_by_side(played):
    """The upstream reports cached_tokens from its own block cache: every later request of a session finds its
    history there (never below the prediction); the first ones find the shared system prompt that the session's own
    history cannot predict (above)."""
    wait_until(lambda: read_watch(played["out"]).live.get("analysed") == played["total"], "the live analysis")
    cache = read_watch(played["out"]).live["cache"]
    assert cache["compared"] == played["total"] and cache["below"] == 0
    assert cache["above"] >= len(played["got"]) - 1  # every first request but the very first finds the preamble


def _one_request(base: str, name: str, index: int, user: str, stream: bool, headers: dict) -> bytes:
    request = recorded_sessions(SAMPLE)[name][index]
    return session_request(request, user, stream), headers


def test_an_upstream_that_fails_mid_stream_is_recorded_as_such(running):
    watch, base = running["watch"], running["base"]
    before = recorded(watch)
    body, headers = _one_request(base, "tool-call-1", 0, "fails/stream", True, {"x-replay-fail-after": "3"})
    with pytest.raises(httpx.RemoteProtocolError):  # the client's connection breaks, as the upstream's did
        httpx.post(f"{base}/chat/completions", content=body, headers=headers, timeout=BOUND_S)
    body2, headers2 = _one_request(base, "tool-call-1", 0, "fails/json", False, {"x-replay-fail-after": "100"})
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{base}/chat/completions", content=body2, headers=headers2, timeout=BOUND_S)
    wait_until(lambda: recorded(watch) >= before + 2, "both exchanges to be recorded")
    mine = {r["request"].get("user"): r for r in records(running["out"]) if "fails/" in str(r["request"].get("user"))}
    sent = {s.request: s for s in running["upstream"].sent}
    for user, raw in (("fails/stream", body), ("fails/json", body2)):
        record = mine[user]
        assert (record["watch"]["outcome"], record["watch"]["complete"]) == ("upstream-failed", False)
        assert upstream_body(record) == bytes(sent[raw].response) and not sent[raw].finished
    assert upstream_body(mine["fails/stream"]).count(b"data: ") == 3
    assert len(upstream_body(mine["fails/json"])) == 100


def test_a_client_that_goes_away_mid_stream(running):
    watch, base = running["watch"], running["base"]
    before = recorded(watch)
    body, headers = _one_request(base, "next-user-turn-2", 0, "gone/stream", True, {"x-replay-chunk-gap": "0.5"})
    with httpx.Client(timeout=BOUND_S) as client:
        with client.stream("POST", f"{base}/chat/completions", content=body, headers=headers) as response:
            received = next(response.iter_raw())
    wait_until(lambda: recorded(watch) >= before + 1, "the exchange to be recorded")
    record = next(r for r in records(running["out"]) if r["request"].get("user") == "gone/stream")
    assert (record["watch"]["outcome"], record["watch"]["complete"]) == ("client-gone", False)
    sent = next(s for s in running["upstream"].sent if s.request == body)
    kept = upstream_body(record)
    # the client got the start of what was recorded, which is the start of what the upstream sent before it stopped
    assert kept.startswith(received) and bytes(sent.response).startswith(kept)
    # the upstream stopped generating: the watch closed its request
    assert not sent.finished and b"[DONE]" not in bytes(sent.response)


def test_error_statuses_odd_bodies_and_other_paths_pass_through(running):
    watch, base = running["watch"], running["base"]
    before = recorded(watch)
    body, headers = _one_request(base, "tool-call-1", 0, "status/json", False, {"x-replay-status": "503"})
    answer = httpx.post(f"{base}/chat/completions", content=body, headers=headers, timeout=BOUND_S)
    assert answer.status_code == 503 and answer.json()["error"]["message"] == "asked to fail"
    odd = b"not json \xff"
    answer = httpx.post(f"{base}/chat/completions", content=odd, timeout=BOUND_S)
    assert answer.status_code == 404  # the upstream's own answer to it: the watch sent it on unchanged
    assert any(s.request == odd for s in running["upstream"].sent)
    models = httpx.get(f"{base}/models", timeout=BOUND_S)
    assert models.json() == {"object": "list", "data": []}
    wait_until(lambda: recorded(watch) >= before + 2, "both chat exchanges to be recorded")
    lines = records(running["out"])[before:]
    assert sorted(r["watch"]["outcome"] for r in lines) == ["unreadable-request", "upstream-status"]
    assert recorded(watch) == before + 2  # /v1/models is passed through, not recorded


def test_an_evicted_cache_is_a_disagreement_below_the_prediction(running):
    watch, base = running["watch"], running["base"]
    requests = recorded_sessions(SAMPLE)["tool-call-1"]
    before = recorded(watch)
    for n, request in enumerate(requests):
        headers = {"content-type": "application/json", **({"x-replay-evict": "1"} if n else {})}
        httpx.post(f"{base}/chat/completions", content=session_request(request, "evicted", False), headers=headers,
                   timeout=BOUND_S).raise_for_status()
    wait_until(lambda: recorded(watch) >= before + len(requests), "the exchanges to be recorded")
    wait_until(lambda: read_watch(running["out"]).live.get("analysed", 0) >=
               sum(r["watch"]["complete"] for r in records(running["out"])), "the live analysis")
    session = next(s for s in read_watch(running["out"]).report["sessions"] if s["key"] == "evicted")
    second = session["requests"][1]
    assert second["server_cached_tokens"] == 0 and second["block_reused_tokens"] > 0
    wait_until(lambda: metric_values(base)[("drift_watch_cache_disagreements_total", (("direction", "below"),))] >= 1,
               "the disagreement to be counted")


def test_a_full_analysis_queue_drops_and_counts_but_records_everything(tmp_path):
    """The recorder alone, fed the proxy's frames through a real pipe, its analysis queue never read: every exchange
    is written, in order, each one past the queue's room counted as dropped."""
    full: queue.Queue = queue.Queue(maxsize=1)
    told = []
    recorder = Recorder(tmp_path / "records.jsonl", full, lambda seq, outcome, offered: told.append((seq, offered)))
    read, write = os.pipe()
    thread = recorder.start(os.fdopen(read, "rb"))
    for seq in range(1, 4):
        exchange = Exchange(seq, b"{}", time.time(), status=200)
        exchange.body += b'{"choices": []}'
        os.write(write, b"".join(exchange_frame(exchange)))
    os.close(write)
    wait_until(lambda: len(told) == 3, "the three exchanges to be written")
    assert [json.loads(line)["watch"]["seq"] for line in (tmp_path / "records.jsonl").read_text().splitlines()] == \
        [1, 2, 3]
    assert recorder.dropped == 2 and told == [(1, True), (2, False), (3, False)]
    assert full.get(timeout=BOUND_S)[0] == 1  # the one line the queue had room for; then the end of the frames
    assert full.get(timeout=BOUND_S) is None
    thread.join(BOUND_S)


def test_the_analysis_is_sent_each_line_read_back_from_the_records(tmp_path):
    """The queue holds where each line is, not the line: the analysis gets "N line" for each, byte for byte the
    records file's lines (non-ASCII text included), in order."""
    lines: queue.Queue = queue.Queue(maxsize=8)
    records = tmp_path / "records.jsonl"
    recorder = Recorder(records, lines, lambda seq, outcome, offered: None)
    for seq, text in enumerate(["plain", "東京 — naïve"], start=1):
        exchange = Exchange(seq, json.dumps({"messages": [{"role": "user", "content": text}]}).encode(), time.time(),
                            status=200)
        exchange.body += json.dumps({"choices": [{"message": {"content": text}}]}, ensure_ascii=False).encode()
        recorder.write(exchange)
    recorder.file.close()
    lines.put(None)
    read, write = os.pipe()
    with os.fdopen(write, "wb") as stdin:
        _send_lines(lines, records, stdin)
    with os.fdopen(read, "rb") as sent:
        assert sent.read() == b"".join(b"%d " % n + line for n, line in enumerate(records.read_bytes().splitlines(
            keepends=True), start=1))
    assert [json.loads(line)["watch"]["seq"] for line in records.read_bytes().splitlines()] == [1, 2]


def test_the_analysis_runs_at_the_lowest_priority(tmp_path):
    """By default every thread of the analysis process is SCHED_IDLE (it runs on CPU time nothing else wants); the
    recorder, which writes every exchange, stays a normal process at nice 10; the proxy is this process. A model
    that does not load still starts both (the records are written whatever becomes of the analysis)."""
    watch = Watch(WatchSettings("http://127.0.0.1:9/v1", "no-such-model", out_dir=str(tmp_path)))
    watch.start()
    try:
        status = wait_until(lambda: (s := watch.status())["analysis"].startswith("failed") and s, "the analysis")
        pids = status["pids"]
        assert pids["proxy"] == os.getpid() and pids["recorder"] == watch.process.pid

        def policies(pid: int) -> set[int]:
            return {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}

        wait_until(lambda: policies(pids["analysis"]) == {os.SCHED_IDLE}, "the analysis to be SCHED_IDLE")
        assert policies(pids["recorder"]) == {os.SCHED_OTHER} and os.getpriority(os.PRIO_PROCESS, pids["recorder"]) \
            == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    finally:
        watch.stop()
    assert watch.status()["analysis"].startswith("failed")


def test_a_finished_response_leaves_its_connection_to_the_next_request():
    """The proxy's pool keeps a connection whose response ended whole, streamed or not, and the next request goes on
    it (httptools says keep-alive only until the message completes: asked later, every connection was closed and
    every request paid a new one)."""
    from engine.watch.connections import UpstreamPool

    server, thread, port = serve(ReplayUpstream(load_completions(SAMPLE)))
    request = recorded_sessions(SAMPLE)["tool-call-1"][0]

    async def two() -> None:
        pool = UpstreamPool(f"http://127.0.0.1:{port}")
        used = []
        for stream in (True, False):
            response = await pool.request("POST", "/v1/chat/completions", [(b"content-type", b"application/json")],
                                          session_request(request, "pool", stream))
            async for _ in response.body():
                pass
            used.append(response.connection)
            response.release()
            assert list(pool.idle) == [used[0]]
        pool.close()

    try:
        asyncio.run(two())
    finally:
        server.should_exit = True
        thread.join(60)


def test_idle_sessions_are_parked_and_come_back_the_same(tmp_path, qwen35):
    """Every session parked after every request (idle after 0 s): what its next request needs is on disk, not in
    memory (the builder keeps its steps only), and each next request takes it back and gets the same step, so the
    live report is still `trace`'s on the same records."""
    records_file = tmp_path / "records.jsonl"
    records_file.write_text(SAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    parking = ParkedSessions(tmp_path / "parked")
    live = LiveAnalysis(qwen35, "vllm@0.33.0", 16, "records.jsonl", parking, session_idle_s=0)
    for n, line in enumerate(records_file.read_text(encoding="utf-8").splitlines(keepends=True), start=1):
        assert live.add_line(n, line)["type"] == "span"
        builders = live.analysis.builders
        assert len(parking) == len(builders) and not live.analysis.active
        assert all(b.previous == () and b.previous_request is None and b.frontier == [] and
                   all(s.prompt_ids is None and s.previous_sequence_ids is None for s in b.steps)
                   for b in builders.values())
        assert sorted(p.name for p in (tmp_path / "parked").iterdir()) == \
            sorted(path.name for path in parking.files.values())
    assert parking.made == 11 and len(parking) == 5  # 11 requests, 5 sessions: 6 came back from disk
    assert live.state()["report"] == analyse_trace(records_file, qwen35, engine="vllm@0.33.0").to_json()


def test_an_unreachable_upstream_is_a_502_and_a_record(tmp_path):
    """Nothing listens upstream: the client gets a 502 with one sentence, the exchange is recorded (its response body
    empty) as upstream-unreachable, and the proxy goes on answering."""
    watch = Watch(WatchSettings("http://127.0.0.1:9/v1", "no-such-model", out_dir=str(tmp_path)))
    watch.start()
    server, thread, port = serve(watch.app)
    try:
        for n in (1, 2):
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=b'{"messages": []}',
                                timeout=BOUND_S)
            assert answer.status_code == 502
            assert answer.json()["error"]["type"] == "upstream_unreachable"
            wait_until(lambda n=n: recorded(watch) == n, "the exchange to be recorded")
    finally:
        server.should_exit = True
        thread.join(60)
        watch.stop()
    assert [(r["watch"]["outcome"], r["watch"]["body"]) for r in records(tmp_path)] == \
        [("upstream-unreachable", "")] * 2
