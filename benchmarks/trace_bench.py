"""How `python -m engine trace` scales: a long agent session and a busy server's multi-session log.

Traces are generated first (samples/traces/generate.py's pipeline and vLLM 0.33.0 log writer, Qwen3.5): one agent
session of 200 requests (a tool call per request, a new user message every 25 requests, which drops the reasoning
and breaks the cache, so every eighth-or-so step is replayed), and a log of 10,000 requests from 50 such sessions
interleaved. Each is analysed at growing sizes (prefixes of the same session, subsets of the same sessions); the
figure that matters is the time per token, which stays flat when the cost grows linearly with the tokens.

    python benchmarks/trace_bench.py [--json PATH] [--requests 200] [--sessions 50] [--reuse]

Each analysis runs in a fresh process (its peak RSS is its own), without fix hints; the session's three times: the
figures only, every break replayed through vllm@0.33.0, and every replayed break attributed by engine.blame.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "samples" / "traces"))

import generate  # noqa: E402

from engine.formats import AssistantTurn, ToolCallSpec  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.scenario import ScriptTurn, load_scenario  # noqa: E402

BUILD = ROOT / "build" / "traces"


def long_scenario(requests: int, ticket: int):
    """An agent reading files one per request; every 25 requests the user asks for the next part."""
    base = load_scenario("tool-call")
    turns = [ScriptTurn("user", text=f"Ticket #{ticket}: review the files of module {ticket} one by one.")]
    for n in range(1, requests + 1):
        turns.append(ScriptTurn("assistant", assistant=AssistantTurn(
            reasoning=f"Next I search for file {n} of module {ticket}.", content="",
            tool_calls=(ToolCallSpec("search", {"query": f"module {ticket} file {n}"}),))))
        if n == requests:
            break
        turns.append(ScriptTurn("tool", text=f"def function_{n}(x):\n    return x * {n} + {ticket}\n"))
        if n % 25 == 0:
            turns.append(ScriptTurn("user", text=f"Good. Continue with the next files after file {n}."))
    from dataclasses import replace

    from engine.scenario import tool_library

    return replace(base, id=f"long-{ticket}", tools=[tool_library()["search"]], turns=tuple(turns))


def write_log(path: Path, sessions) -> int:
    generate.write_vllm(path, sessions, "Qwen/Qwen3.5-0.8B")
    return path.stat().st_size


_MEASURE = """
import json, resource, sys, time
from engine.models import load_model
from engine.traces.report import analyse_trace
model = load_model(sys.argv[2])
start = time.perf_counter()
mode = sys.argv[3]  # "": figures only; "replay": every break replayed; "attribute": and blamed
report = analyse_trace(sys.argv[1], model, engine="vllm@0.33.0" if mode else None, hints=False,
                       attribute=mode == "attribute")
seconds = time.perf_counter() - start
tokens = sum(s.row.prompt_tokens + (s.row.decode_tokens or 0) for t in report.sessions for s in t.steps)
print(json.dumps({"requests": report.requests, "sessions": len(report.sessions), "tokens": tokens,
                  "breaks": sum(t.breaks for t in report.sessions), "replayed": len(report.replays),
                  "seconds": round(seconds, 3), "us_per_token": round(seconds / tokens * 1e6, 3),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def timed(path: Path, mode: str) -> dict:
    """One analysis in a fresh process, so its peak RSS is its own."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), generate.MODEL, mode], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return {"file": path.name, "mode": mode or "figures", "bytes": path.stat().st_size, **json.loads(out.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--reuse", action="store_true", help="analyse the traces already in build/traces/")
    parser.add_argument("--only", choices=("session", "log"), help="run one of the two parts")
    parser.add_argument("--json")
    args = parser.parse_args()
    BUILD.mkdir(parents=True, exist_ok=True)
    sizes = (args.requests // 4, args.requests // 2, args.requests)
    counts = (args.sessions // 4, args.sessions // 2, args.sessions)
    session_paths = [BUILD / f"session-{size}.log" for size in sizes]
    log_paths = [BUILD / f"log-{count}-sessions.log" for count in counts]
    if not (args.reuse and all(p.is_file() for p in session_paths + log_paths)):
        model = load_model(generate.MODEL)
        start = time.perf_counter()
        session = generate.run_session(model, long_scenario(args.requests, 0), "vllm@0.33.0", "long-0")
        for r in session:
            r.request_id = f"{r.number:016x}"
        print(f"generated a {len(session)}-request session in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        for size, path in zip(sizes, session_paths):
            write_log(path, [session[:size]])
        start = time.perf_counter()
        many = []
        for n in range(args.sessions):
            requests = generate.run_session(model, long_scenario(10_000 // args.sessions, n + 1), "vllm@0.33.0",
                                            f"long-{n + 1}")
            for r in requests:
                r.request_id = f"{n:08x}{r.number:08x}"
            many.append(requests)
        print(f"generated {sum(len(s) for s in many)} requests in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
        for count, path in zip(counts, log_paths):
            write_log(path, many[:count])
    results: dict = {"session": [], "log": []}
    for path in session_paths if args.only != "log" else ():
        for mode in ("", "replay", "attribute"):
            results["session"].append(timed(path, mode))
            print(json.dumps(results["session"][-1]), file=sys.stderr)
    for path in log_paths if args.only != "session" else ():
        results["log"].append(timed(path, ""))
        print(json.dumps(results["log"][-1]), file=sys.stderr)
    text = json.dumps(results, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
