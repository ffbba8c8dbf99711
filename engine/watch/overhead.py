"""What the watch costs a request: `python -m engine bench`'s watch section.

A replay upstream (upstream.py, paced as a generating server: a first token after `first_token_s`, chunks
`chunk_gap_s` apart) and the watch in front of it (`python -m engine watch`, with its analysis process) each run as a
process of their own; this process is the clients: `sessions` sessions at once, each one of the samples' sessions
request after request, streamed. The same sessions run straight to the upstream and through the watch, in
alternating rounds in one run, and each request's time to its last byte is kept. Added latency is the difference of
the two distributions' percentiles (p50, p99); the proxy's peak RSS is its process' high-water mark (VmHWM), the
analysis process' beside it. A benchmark, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from engine.watch.upstream import recorded_sessions, session_request

ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLE = ROOT / "samples" / "traces" / "openai.jsonl"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _vm(pid: int, field: str = "VmHWM") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _wait(url: str, ready: Any, bound_s: float = 600) -> dict:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=5)
            if ready(answer):
                return answer.json() if "json" in answer.headers.get("content-type", "") else {}
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {bound_s:.0f} s")


async def _round(base: str, sessions: dict[str, list[dict]], count: int, tag: str) -> list[float]:
    names = sorted(sessions)
    times: list[float] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=count * 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def one(n: int) -> None:
            name = names[n % len(names)]
            for request in sessions[name]:
                body = session_request(request, f"{tag}/{name}/{n}", True)
                start = time.perf_counter()
                async with client.stream("POST", f"{base}/chat/completions", content=body,
                                         headers={"content-type": "application/json"}) as response:
                    async for _ in response.aiter_raw():
                        pass
                times.append(time.perf_counter() - start)
                if response.status_code != 200:
                    raise RuntimeError(f"{base}: status {response.status_code}")

        await asyncio.gather(*(one(n) for n in range(count)))
    return times


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def watch_overhead(sessions: int = 200, rounds: int = 2, model: str = "qwen3.5", engine: str = "vllm@0.33.0",
                   first_token_s: float = 0.05, chunk_gap_s: float = 0.01) -> dict[str, Any]:
    samples = recorded_sessions(SAMPLE)
    up_port, watch_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    upstream = subprocess.Popen([sys.executable, "-c", "import sys; from engine.watch.upstream import serve_upstream; "
                                 "serve_upstream(sys.argv[1], '127.0.0.1', int(sys.argv[2]), float(sys.argv[3]), "
                                 "float(sys.argv[4]))", str(SAMPLE), str(up_port), str(first_token_s),
                                 str(chunk_gap_s)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    out = tempfile.mkdtemp(prefix="drift-watch-bench-")
    watch = subprocess.Popen([sys.executable, "-m", "engine", "watch", "--upstream", f"http://127.0.0.1:{up_port}/v1",
                              "--model", model, "--engine", engine, "--port", str(watch_port), "--out", out,
                              "--queue", "1024"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    direct, proxied = f"http://127.0.0.1:{up_port}/v1", f"http://127.0.0.1:{watch_port}/v1"
    try:
        _wait(f"{direct}/models", lambda a: a.status_code == 200)
        _wait(f"http://127.0.0.1:{watch_port}/watch/state", lambda a: a.json().get("analysis") == "ready")
        rss_idle = _vm(watch.pid, "VmRSS")
        times: dict[str, list[float]] = {"direct": [], "watch": []}
        for r in range(rounds):
            for mode, base in (("direct", direct), ("watch", proxied)):
                times[mode] += asyncio.run(_round(base, samples, sessions, f"{mode}{r}"))
        state = _wait(f"http://127.0.0.1:{watch_port}/watch/state", lambda a: a.json()["queued"] == 0, 1200)
        analysis = _children(watch.pid)
        figures = {}
        for mode, values in times.items():
            figures[mode] = {"requests": len(values), "p50_ms": round(_percentile(values, 0.5) * 1000, 3),
                             "p99_ms": round(_percentile(values, 0.99) * 1000, 3),
                             "mean_ms": round(statistics.fmean(values) * 1000, 3)}
        return {
            "sessions": sessions, "rounds": rounds, "requests_per_round": len(times["watch"]) // rounds,
            "stream": True, "upstream_pacing": {"first_token_s": first_token_s, "chunk_gap_s": chunk_gap_s},
            "direct": figures["direct"], "watch": figures["watch"],
            "added_p50_ms": round(figures["watch"]["p50_ms"] - figures["direct"]["p50_ms"], 3),
            "added_p99_ms": round(figures["watch"]["p99_ms"] - figures["direct"]["p99_ms"], 3),
            "proxy_peak_rss_mb": round(_vm(watch.pid) or 0.0, 1),
            "proxy_rss_idle_mb": round(rss_idle or 0.0, 1),
            "analysis_peak_rss_mb": round(sum(_vm(p) or 0.0 for p in analysis), 1),
            "recorded": state["recorded"], "dropped": state["dropped"],
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        for process in (watch, upstream):
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def watch_text(section: dict[str, Any]) -> list[str]:
    if not section:
        return []
    if "error" in section:
        return [f"watch            {section['error']}"]
    d, w = section["direct"], section["watch"]
    return [
        f"watch            +{section['added_p99_ms']:.2f} ms p99, +{section['added_p50_ms']:.2f} ms p50 per request "
        f"({section['sessions']} concurrent streamed sessions x {section['rounds']} rounds, "
        f"{w['requests']} requests each way; direct p50 {d['p50_ms']:.1f} / p99 {d['p99_ms']:.1f} ms, through "
        f"the watch {w['p50_ms']:.1f} / {w['p99_ms']:.1f} ms)",
        f"watch memory     proxy peak RSS {section['proxy_peak_rss_mb']:.0f} MiB (idle "
        f"{section['proxy_rss_idle_mb']:.0f}), analysis process {section['analysis_peak_rss_mb']:.0f} MiB; "
        f"{section['recorded']} recorded, "
        f"{section['dropped']} not analysed live (queue full)",
    ]


if __name__ == "__main__":  # one section alone: python -m engine.watch.overhead
    print(json.dumps(watch_overhead(), indent=2))
