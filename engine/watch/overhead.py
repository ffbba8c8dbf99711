"""What the watch costs a request: `python -m engine bench`'s watch section.

Three kinds of process, none sharing an interpreter, an event loop or a session with another: the replay upstream
(upstream.py, paced as a generating server: its first chunk after `first_token_s`, each later chunk after the decode
steps of the tokens it carries, `token_s` each, on a schedule from the request's arrival), the watch in front of it
(`python -m engine watch`: the proxy; its recorder process, nice 10; the recorder's analysis process, SCHED_IDLE)
and the load generator (`load_pairs` below, a process of its own: uvloop when it is
installed, httptools' parser on non-blocking sockets kept alive, no HTTP library between it and the socket, so that
it costs little beside what it measures; the times of a response's bytes are the kernel's arrival times, so that its
own wait for a core is not counted on either side).

Each of `sessions` clients runs the samples' sessions request after request, streamed, `rounds` times, and sends every
request twice at the same moment: once straight to the upstream and once through the watch (which of the two is
written first is drawn at random per pair). So both requests of a pair meet the same machine: the same load from
other jobs, the same upstream timers. Per pair, the added latency is the watch's time minus the direct one, for the
first byte of the body (the first streamed event: what a client waits for) and for the last byte; the section reports
the distribution of those differences (p50, p90, p99, max), not a difference of two distributions' percentiles. The
first round warms the connections (the watch's pool to the upstream included) and is left out.

Beside the figure: the load average before and after, the CPU time each process spent during the load (the proxy's
per request and per streamed chunk), and memory: each process' peak RSS (VmHWM) and the highest sum of the watch's
processes' RSS sampled every 0.2 s during the load. And the measurement's floor: once the analysis has caught up,
the same load again with both copies of each pair sent straight to the upstream, the watch idle beside it; the spread
of those differences (the upstream serving two copies in different turns of its loop, each waiting for a core) is
what an added figure cannot be told apart from. A benchmark, not a test: nothing here asserts a timing.

How others measure a proxy's overhead, and what is followed here: Envoy's benchmarking guidance (against a direct
connection, with no queueing limits in the proxy, checking that every stream and connection is the one expected);
LiteLLM's (a fake OpenAI-compatible endpoint with a fixed latency, so that the proxy's share shows); and gateway
benchmarks that interleave direct and proxied requests in one run rather than measuring them one after the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from engine.serving.real.process import process_cpu_s
from engine.watch.upstream import recorded_sessions, session_request

ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLE = ROOT / "samples" / "traces" / "openai.jsonl"


@dataclasses.dataclass(frozen=True)
class UpstreamPacing:
    """How fast the bench's upstream streams. The default is a model server's pace at a few hundred concurrent
    streams: about 100 ms to the first token of a ~1k-token prompt whose prefix is cached, then a decode step every
    20 ms (50 tokens a second per stream)."""

    first_token_s: float = 0.1
    token_s: float = 0.02


BUSY_SERVER = UpstreamPacing()

BOUND_S = 600.0  # a bound for a hang, not a speed
DRAIN_BOUND_S = 300.0  # how long the section waits for the analysis to catch up after the load


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status_field(pid: int, field: str) -> float | None:
    """A /proc/PID/status memory figure in MiB (VmRSS, VmHWM)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when /proc cannot tell)."""
    return process_cpu_s(pid) or 0.0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() + f" ({pid})"
    except OSError:
        return str(pid)


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - a local URL the bench made
        return json.loads(answer.read())


def _wait(url: str, ready: Any, bound_s: float = BOUND_S) -> Any:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            value = _get_json(url)
            if ready(value):
                return value
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {bound_s:.0f} s")


# ---- the load generator (its own process) ----------------------------------------------------------------------


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux: each read says when its bytes reached the socket
_TIMESPEC = struct.Struct("qq")


class _Connection:
    """One keep-alive HTTP/1.1 connection: a request written whole, its response read by httptools' parser (in C).

    The times of the first body byte and of the last byte are the kernel's: when the bytes of the read that holds
    them reached this socket (SO_TIMESTAMPNS), not when this process got round to reading them. One process reads
    all 2 x N streams; on a busy machine it waits for a core too, and a wait taken by the loop's clock falls on
    whichever side of a pair it reads second: noise in the differences that is not the watch's. The watch's own
    waits are all in the kernel's times: its bytes reach the client's socket only once the watch has written them.
    (A read that holds two events is stamped with the later one's arrival, so a first byte read that late is late
    by one event, as it was by the loop's clock.)"""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self.done: asyncio.Future | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        await loop.sock_connect(sock, (self.host, self.port))
        self.sock = sock
        loop.add_reader(sock.fileno(), self._readable)

    async def exchange(self, raw: bytes) -> tuple[float, float, int, bytes]:
        """(seconds to the first body byte, seconds to the last byte, status, body)."""
        import httptools

        assert self.sock is not None
        self.parser = httptools.HttpResponseParser(self)
        self.body, self.first, self.last, self.now = bytearray(), 0.0, 0.0, 0.0
        self.done = asyncio.get_running_loop().create_future()
        start = time.time()  # the kernel's timestamps are on the same clock (CLOCK_REALTIME)
        sent = self.sock.send(raw)
        if sent < len(raw):
            await asyncio.get_running_loop().sock_sendall(self.sock, raw[sent:])
        await self.done
        return self.first - start, self.last - start, self.parser.get_status_code(), bytes(self.body)

    def _readable(self) -> None:
        assert self.sock is not None
        try:
            data, ancillary, _, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(_TIMESPEC.size))
        except BlockingIOError:
            return
        except OSError as err:
            self._lost(err)
            return
        self.now = time.time()
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack(value[:_TIMESPEC.size])
                self.now = seconds + nanoseconds * 1e-9
        if not data:
            self._lost(None)
            return
        self.parser.feed_data(data)

    def _lost(self, err: Exception | None) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection closed mid-response ({err or 'EOF'})"))

    def close(self) -> None:
        if self.sock is not None:
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        if not self.body:
            self.first = self.now
        self.body += body

    def on_message_complete(self) -> None:
        self.last = self.now
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


def _raw_request(port: int, path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def _load(targets: dict[str, int], sessions: int, rounds: int, ramp_s: float) -> list[list]:
    samples = recorded_sessions(SAMPLE)
    names = sorted(samples)
    pairs: list[list] = []

    async def client(n: int) -> None:
        draw = random.Random(n)
        await asyncio.sleep(ramp_s * n / sessions)  # arrivals spread, not all at one instant
        connections = {mode: _Connection("127.0.0.1", port) for mode, port in targets.items()}
        for connection in connections.values():
            await connection.open()
        for r in range(rounds):
            name = names[(n + r) % len(names)]
            for request in samples[name]:
                raws = {mode: _raw_request(port, "/v1/chat/completions",
                                           session_request(request, f"{mode}/{r}/{name}/{n}", True))
                        for mode, port in targets.items()}
                order = sorted(targets, key=lambda _: draw.random())
                results = dict(zip(order, await asyncio.gather(*(connections[m].exchange(raws[m]) for m in order))))
                d, w = results["direct"], results["watch"]
                pairs.append([r, d[0], d[1], w[0], w[1], d[2], w[2], d[3] == w[3], d[3].count(b"\n\ndata: ") + 1])
        for connection in connections.values():
            connection.close()

    await asyncio.gather(*(client(n) for n in range(sessions)))
    return pairs


def load_pairs(direct_port: int, watch_port: int, sessions: int, rounds: int, ramp_s: float = 1.0) -> list[list]:
    """Every request sent straight and through the watch at once: [round, direct first byte s, direct last byte s,
    watch first byte s, watch last byte s, direct status, watch status, same body bytes, events in the stream]."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_load({"direct": direct_port, "watch": watch_port}, sessions, rounds, ramp_s))
    return uvloop.run(_load({"direct": direct_port, "watch": watch_port}, sessions, rounds, ramp_s))


# ---- the section ------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _distribution_ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(_percentile(values, 0.5) * 1000, 3), "p90": round(_percentile(values, 0.9) * 1000, 3),
            "p99": round(_percentile(values, 0.99) * 1000, 3), "max": round(max(values) * 1000, 3)}


class _MemorySampler(threading.Thread):
    """The sum of the watch's processes' RSS, every 0.2 s: its highest value, and each process' own highest."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(name="watch-bench-rss", daemon=True)
        self.pids, self.peak_sum = pids, 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.peak_sum = max(self.peak_sum, sum(_status_field(p, "VmRSS") or 0.0 for p in self.pids))


def _run_load(direct_port: int, watch_port: int, sessions: int, rounds: int, env: dict[str, str]) -> list[list]:
    """`load_pairs` in a process of its own."""
    loader = subprocess.run([sys.executable, "-c", "import json, sys; from engine.watch.overhead import "
                             "load_pairs; print(json.dumps(load_pairs(*map(int, sys.argv[1:]))))",
                             str(direct_port), str(watch_port), str(sessions), str(rounds)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=BOUND_S,
                            start_new_session=True)
    if loader.returncode != 0:
        raise RuntimeError(f"the load generator failed: {loader.stderr.strip().splitlines()[-1:]}")
    return json.loads(loader.stdout)


def watch_overhead(sessions: int = 200, rounds: int = 3, model: str = "qwen3.5", engine: str = "vllm@0.33.0",
                   pacing: UpstreamPacing = BUSY_SERVER) -> dict[str, Any]:
    up_port, watch_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # Each of the three as a program of its own (a server, the watch, the clients), each in a session of its own: with
    # autogroup on, a session is a scheduling group, and in one group the proxy took turns with the upstream and the
    # load generator inside one share of the machine, which a watch started on its own does not.
    quiet = {"cwd": ROOT, "env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
             "start_new_session": True}
    upstream = subprocess.Popen([sys.executable, "-m", "engine.watch.upstream", str(SAMPLE), str(up_port),
                                 str(pacing.first_token_s), str(pacing.token_s)], **quiet)
    out = tempfile.mkdtemp(prefix="drift-watch-bench-")
    watch = subprocess.Popen([sys.executable, "-m", "engine", "watch", "--upstream", f"http://127.0.0.1:{up_port}/v1",
                              "--model", model, "--engine", engine, "--port", str(watch_port), "--out", out,
                              "--queue", "1024"], **quiet)
    state_url = f"http://127.0.0.1:{watch_port}/watch/state"
    try:
        _wait(f"http://127.0.0.1:{up_port}/v1/models", lambda answer: True)
        roles = {pid: role for role, pid in _wait(state_url, lambda state: state.get("analysis") == "ready")
                 ["pids"].items()}
        watch_pids = [watch.pid]
        for pid in watch_pids:  # every descendant: the recorder, its analysis process, any engine worker of that
            watch_pids += [c for c in _children(pid) if c not in watch_pids]
        names = {p: roles.get(p, _name(p)) for p in watch_pids}
        idle = {names[p]: round(_status_field(p, "VmRSS") or 0.0, 1) for p in watch_pids}
        sampler = _MemorySampler(watch_pids)
        sampler.start()
        loads = [os.getloadavg()]
        cpu_before = {p: _cpu_s(p) for p in [upstream.pid, *watch_pids]}
        pairs = _run_load(up_port, watch_port, sessions, rounds, env)
        loads.append(os.getloadavg())
        cpu = {p: _cpu_s(p) - before for p, before in cpu_before.items()}
        state = _wait(state_url, lambda s: s["recorded"] >= len(pairs), BOUND_S)
        behind, drain_started, drain_s = state["queued"], time.monotonic(), None
        try:  # the analysis is SCHED_IDLE: on a busy machine it catches up only as CPU time comes free
            state = _wait(state_url, lambda s: s["queued"] == 0, DRAIN_BOUND_S)
            drain_s = round(time.monotonic() - drain_started, 1)
        except RuntimeError:
            state = _get_json(state_url)
        sampler.stop.set()
        sampler.join()
        # The measurement's own floor: the same load with both copies sent straight to the upstream (the watch idle
        # beside it). Its differences are the upstream's and the machine's, none of them the watch's.
        floor_load = os.getloadavg()
        floor = [p for p in _run_load(up_port, up_port, sessions, rounds, env) if p[0] > 0]
        measured = [p for p in pairs if p[0] > 0]  # round 0 warms the connections
        events = sum(p[8] for p in pairs)
        return {
            "sessions": sessions, "rounds": rounds, "warmup_rounds": 1, "pairs": len(measured),
            "stream": True, "upstream_pacing": dataclasses.asdict(pacing),
            "events_per_request": round(events / len(pairs), 1),
            "added_ttfb_ms": _distribution_ms([p[3] - p[1] for p in measured]),
            "added_total_ms": _distribution_ms([p[4] - p[2] for p in measured]),
            "floor_ttfb_ms": _distribution_ms([p[3] - p[1] for p in floor]),
            "floor_total_ms": _distribution_ms([p[4] - p[2] for p in floor]),
            "floor_load_average": [round(x, 2) for x in floor_load],
            "direct_ttfb_ms": _distribution_ms([p[1] for p in measured]),
            "direct_total_ms": _distribution_ms([p[2] for p in measured]),
            "watch_total_ms": _distribution_ms([p[4] for p in measured]),
            "bodies_differ": sum(1 for p in pairs if not p[7]),
            "statuses": sorted({f"{p[5]}/{p[6]}" for p in pairs}),
            "cpu_s": {names[p]: round(cpu[p], 2) for p in watch_pids} | {"upstream": round(cpu[upstream.pid], 2)},
            "proxy_cpu_ms_per_request": round(cpu[watch.pid] / len(pairs) * 1000, 3),
            "proxy_cpu_us_per_event": round(cpu[watch.pid] / events * 1e6, 1),
            "rss_idle_mb": idle,
            "rss_peak_mb": {names[p]: round(_status_field(p, "VmHWM") or 0.0, 1) for p in watch_pids},
            "rss_sum_peak_during_load_mb": round(sampler.peak_sum, 1),
            "recorded": state["recorded"], "dropped": state["dropped"], "analysed": state.get("analysed"),
            "analysis_behind_after_load": behind, "analysis_caught_up_s": drain_s,
            "analysis_queued_at_end": state["queued"],
            "load_average": {"before": [round(x, 2) for x in loads[0]], "after": [round(x, 2) for x in loads[1]]},
            "cpus": os.cpu_count(),
        }
    finally:
        for process in (watch, upstream):
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(out, ignore_errors=True)  # the run's records: tens of MB a run, read by nothing after it


def watch_text(section: dict[str, Any]) -> list[str]:
    if not section:
        return []
    if "error" in section:
        return [f"watch            {section['error']}"]
    t, b, d = section["added_ttfb_ms"], section["added_total_ms"], section["direct_total_ms"]
    f, g = section["floor_ttfb_ms"], section["floor_total_ms"]
    load = section["load_average"]
    cpu = ", ".join(f"{name} {s:.1f} s" for name, s in section["cpu_s"].items())
    return [
        f"watch            added per request (through the watch minus direct, {section['pairs']} pairs at "
        f"{section['sessions']} concurrent streamed sessions): first byte p50 {t['p50']:+.2f} / p99 {t['p99']:+.2f} "
        f"ms, last byte p50 {b['p50']:+.2f} / p99 {b['p99']:+.2f} ms (max {b['max']:+.1f}); direct last byte p50 "
        f"{d['p50']:.0f} / p99 {d['p99']:.0f} ms; load average {load['before'][0]:.2f} -> {load['after'][0]:.2f} "
        f"on {section['cpus']} CPUs",
        f"watch floor      direct against direct, the same load (load average {section['floor_load_average'][0]:.2f}): "
        f"first byte p99 {f['p99']:+.2f} ms, last byte p99 {g['p99']:+.2f} ms (max {g['max']:+.1f}): the "
        "measurement's own spread, none of it the watch's",
        f"watch cost       proxy CPU {section['proxy_cpu_ms_per_request']:.2f} ms per request, "
        f"{section['proxy_cpu_us_per_event']:.0f} us per streamed event ({section['events_per_request']} events a "
        f"request); CPU during the load: {cpu}; bodies differing {section['bodies_differ']}",
        "watch memory     peak RSS " + ", ".join(f"{n} {v:.0f}" for n, v in section["rss_peak_mb"].items())
        + f" MiB; sum during the load at most {section['rss_sum_peak_during_load_mb']:.0f} MiB; "
        f"{section['recorded']} recorded, {section['dropped']} not analysed live (queue full); the analysis "
        f"{section['analysis_behind_after_load']} behind when the load ended, "
        + (f"caught up {section['analysis_caught_up_s']} s later" if section['analysis_caught_up_s'] is not None
           else f"not caught up {DRAIN_BOUND_S:.0f} s later"),
    ]


if __name__ == "__main__":  # one section alone: python -m engine.watch.overhead [SESSIONS [ROUNDS]]
    print(json.dumps(watch_overhead(*map(int, sys.argv[1:3])), indent=2))
