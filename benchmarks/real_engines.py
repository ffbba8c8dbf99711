"""Every vLLM and SGLang release through the real-engine backend, against the golden corpus (non-streaming).

    python benchmarks/real_engines.py [--engines vllm,sglang] [--releases 0.10.0,0.25.1] [--docs] [--json PATH]

For each release: does it load (its worker starts and lists its parsers), and what do the golden corpus's
non-streaming cases give. The golden files (tests/golden/) hold what the real parsers of the three pinned releases
returned; a release is compared with the nearest pinned release of the same engine (by release order), so
"passes" means "returns what that pinned release returns for every case", and "differs" says how many cases and
which fields. Cases whose parser the release does not register count as "parser missing" (named). `--docs`
rewrites the table between the markers in docs/real-engines.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "tests" / "conformance"))

import corpus  # noqa: E402
from golden_serving import normalised, run_case  # noqa: E402

from engine.serving.real import fetch  # noqa: E402
from engine.serving.real.backend import AddedVocab, EngineWorkerError, RealEngine, worker_for  # noqa: E402

GOLDEN = PROJECT / "tests" / "golden"
PINNED = {"vllm": ["0.33.0"], "sglang": ["0.5.12", "0.5.23"]}
BEGIN, END = "<!-- real-engines:begin -->", "<!-- real-engines:end -->"
# CI's sample: spread over each engine's range, the pinned releases included.
CI_RELEASES = {"vllm": ["0.10.0", "0.15.1", "0.20.2", "0.24.0", "0.25.1", "0.30.0", "0.33.0"],
               "sglang": ["0.5.1", "0.5.5", "0.5.10", "0.5.12", "0.5.13", "0.5.18", "0.5.23"]}


def nearest_pinned(engine: str, version: str) -> str:
    releases = [r.version for r in fetch.list_releases(engine, offline=True)] or [version]
    order = {v: i for i, v in enumerate(sorted(set(releases) | {version, *PINNED[engine]}, key=Version))}
    return min(PINNED[engine], key=lambda p: (abs(order[p] - order[version]), -order[p]))


def golden_cases(spec: str, mode: str = "ns") -> list[dict]:
    """The golden cases of a pinned release in one mode ("ns" non-streaming, "st" streaming), with their tools."""
    cases = []
    for path in sorted((GOLDEN / spec).glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        for case in payload["cases"]:
            if case["mode"] == mode:
                cases.append({**case, "family": payload["family"], "tools": case.get("tools", payload["tools"])})
    return cases


@dataclass
class Row:
    spec: str
    loads: bool
    against: str
    cases: int = 0
    passes: int = 0
    differs: Counter = field(default_factory=Counter)  # field -> cases
    missing: set[str] = field(default_factory=set)  # parser names the release does not register
    missing_cases: int = 0
    errors: int = 0
    warnings: set[str] = field(default_factory=set)
    note: str = ""
    start_s: float = 0.0
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        if not self.loads:
            return f"does not load: {self.note}"
        if self.cases == self.missing_cases:
            return "parser missing: " + ", ".join(sorted(self.missing))
        ran = self.cases - self.missing_cases
        if self.passes == ran:
            text = f"passes ({ran}/{ran})"
        else:
            fields = ", ".join(f"{name} {count}" for name, count in self.differs.most_common())
            text = f"differs in {ran - self.passes}/{ran} ({fields})"
        if self.missing:
            text += f"; parser missing: {', '.join(sorted(self.missing))} ({self.missing_cases} cases)"
        return text

    def to_json(self) -> dict:
        return {"release": self.spec, "loads": self.loads, "against": self.against, "cases": self.cases,
                "passes": self.passes, "differs": dict(self.differs), "parser_missing": sorted(self.missing),
                "missing_cases": self.missing_cases, "errors": self.errors, "warnings": sorted(self.warnings),
                "verdict": self.verdict(), "worker_start_s": round(self.start_s, 3), "seconds": round(self.seconds, 2),
                "examples": self.examples[:5]}


def check_release(engine_name: str, version: str, mode: str = "ns") -> Row:
    """One release on the golden corpus in one mode ("ns" non-streaming, "st" streaming with the golden chunks)."""
    spec = f"{engine_name}@{version}"
    against = version if version in PINNED[engine_name] else nearest_pinned(engine_name, version)
    row = Row(spec, loads=False, against=f"{engine_name}@{against}")
    started = time.perf_counter()
    try:
        worker = worker_for(engine_name, version)
        row.start_s = worker.start_s
        engine = RealEngine(engine_name, version)
        reasoning_names, tool_names = set(engine.reasoning_parsers), set(engine.tool_parsers)
        row.loads = True
    except (EngineWorkerError, fetch.FetchError) as err:
        row.note = str(err)
        return row
    for case in golden_cases(f"{engine_name}@{against}", mode):
        row.cases += 1
        absent = [f"{kind} {name}" for kind, name, names in (("reasoning", case["reasoning_parser"], reasoning_names),
                                                             ("tool", case["tool_parser"], tool_names))
                  if name and name not in names]
        if absent:
            row.missing.update(absent)
            row.missing_cases += 1
            continue
        result = run_case(engine, case)
        row.warnings.update(result.warnings)
        got = normalised(result)
        if result.error:
            row.errors += 1
        if got == case["expected"] or (got is None and case["expected"] is None):
            row.passes += 1
            continue
        if got is None or case["expected"] is None:
            row.differs["error"] += 1
        else:
            row.differs.update(k for k in ("reasoning", "content", "tool_calls") if got[k] != case["expected"][k])
        row.examples.append(f"{case['id']}: {result.error or got}")
    row.seconds = time.perf_counter() - started
    return row


def stale_citations(spec: str) -> dict[str, dict]:
    """The pinned emulation's cited lines that the release never executed on the golden corpus (non-streaming).

    Each golden case runs through the emulation (its edits cite `path:line[-end]`) and through the real release
    with the line tracer; a citation is stale when none of its lines ran in that file for that case. Returns
    {"path:range": {"step", "cases", "first_case", "executed_near"}} (executed lines of that file within 15 lines).
    The check is by overlap: a range that is stale but overlaps other executed code passes."""
    from engine.serving.registry import get_engine

    engine_name, version = spec.split("@")
    emulation, real = get_engine(spec), RealEngine(engine_name, version)
    stale: dict[str, dict] = {}
    for case in golden_cases(spec):
        if not emulation.emulates(case["reasoning_parser"], case["tool_parser"]):  # the release's own code serves it
            continue
        emulated = emulation.parse(case["text"], reasoning_parser=case["reasoning_parser"],
                                   tool_parser=case["tool_parser"], tools=case["tools"],
                                   chat_template_kwargs=case["chat_template_kwargs"],
                                   history_tool_calls=case["history_tool_calls"])
        if not emulated.edits:
            continue
        run_case(real, case, trace=True)
        executed = real.last_trace["lines"] if real.last_trace else {}
        for edit in emulated.edits:
            where = edit.location
            lines = set(executed.get(where.path, []))
            cited = set(range(where.line, (where.end_line or where.line) + 1))
            if lines & cited:
                continue
            key = f"{where.path}:{where.line}" + (f"-{where.end_line}" if where.end_line else "")
            entry = stale.setdefault(key, {"step": edit.step, "cases": 0, "first_case": case["id"],
                                           "executed_near": set()})
            entry["cases"] += 1
            entry["executed_near"].update(n for n in lines if abs(n - where.line) <= 15)
    return {k: {**v, "executed_near": sorted(v["executed_near"])} for k, v in sorted(stale.items())}


def releases_table(rows: list[Row], streamed: list[Row]) -> str:
    lines = ["| release | loads | against | golden corpus, non-streaming | streaming (golden chunks) |",
             "|---|---|---|---|---|"]
    for row, stream in zip(rows, streamed):
        lines.append(f"| {row.spec} | {'yes' if row.loads else 'no'} | {row.against} | {row.verdict()} | "
                     f"{stream.verdict() if row.loads else ''} |")
    return "\n".join(lines)


def write_docs_table(rows: list[Row], streamed: list[Row]) -> None:
    page = PROJECT / "docs" / "real-engines.md"
    text = page.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    page.write_text(text[:start] + "\n" + releases_table(rows, streamed) + "\n" + text[end:], encoding="utf-8")


def bench(model: str, scenario: str, repeat: int) -> dict:
    """Warm parse calls, cold worker starts, and the cell's timeline over every release cold and warm.

    Cold = sources cached, no worker running, the simulator's cell cache empty; warm = every release's worker alive
    (the worker limit is raised to the number of releases for this run) and the cell cache emptied again."""
    import statistics

    from engine.serving.real import backend
    from engine.simulate import _cached_cell
    from engine.timeline import timeline

    figures: dict = {"model": model, "scenario": scenario}
    text = ("<think>\nhmm\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call>")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    vocab = AddedVocab(dict(corpus.FAMILIES["qwen3"].special_tokens), frozenset())
    for spec in ("vllm@0.33.0", "vllm@0.20.2", "sglang@0.5.23", "sglang@0.5.12"):
        engine = RealEngine(*spec.split("@"))
        for trace, name in ((False, "warm_parse_ms"), (True, "warm_traced_parse_ms")):
            engine.parse(text, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=tools, vocab=vocab,
                         trace=trace)
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                engine.parse(text, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=tools, vocab=vocab,
                             trace=trace)
                times.append((time.perf_counter() - started) * 1000)
            figures[f"{name} {spec}"] = {"median": round(statistics.median(times), 3), "max": round(max(times), 3)}
    for engine_name in ("vllm", "sglang"):
        versions = [r.version for r in fetch.list_releases(engine_name)]
        backend.stop_workers()
        starts = {}
        for version in versions:
            worker = backend.worker_for(engine_name, version, backend.WorkerLimits(max_workers=len(versions)))
            starts[version] = round(worker.start_s, 3)
        figures[f"cold_worker_start_s {engine_name}"] = starts
        backend.stop_workers()
        _cached_cell.cache_clear()
        limits = os.environ.get("DRIFT_ENGINE_MAX_WORKERS")
        os.environ["DRIFT_ENGINE_MAX_WORKERS"] = str(len(versions))
        try:
            started = time.perf_counter()
            rows = timeline(model, scenario, engine_name)
            cold = time.perf_counter() - started
            _cached_cell.cache_clear()
            started = time.perf_counter()
            timeline(model, scenario, engine_name)
            warm = time.perf_counter() - started
        finally:
            if limits is None:
                os.environ.pop("DRIFT_ENGINE_MAX_WORKERS", None)
            else:
                os.environ["DRIFT_ENGINE_MAX_WORKERS"] = limits
            backend.stop_workers()
        figures[f"timeline_s {engine_name}"] = {"releases": len(rows), "cold": round(cold, 2), "warm": round(warm, 2),
                                               "changed_at": [r.release for r in rows if r.changed]}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="vllm,sglang")
    parser.add_argument("--releases", help="comma-separated versions (default: every release); 'ci' for CI's sample")
    # --readme: the table's old home, kept as an alias
    parser.add_argument("--docs", "--readme", dest="docs", action="store_true",
                        help="rewrite the table in docs/real-engines.md")
    parser.add_argument("--json", help="write the rows as JSON to PATH ('-' for stdout)")
    parser.add_argument("--bench", metavar="MODEL:SCENARIO", help="the benchmark figures instead of the table")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--citations", metavar="ENGINE@VERSION", help="the pinned emulation's cited lines that the "
                        "release never executed on the golden corpus")
    args = parser.parse_args(argv)
    if args.citations:
        print(json.dumps(stale_citations(args.citations), indent=1))
        return 0
    if args.bench:
        model, scenario = args.bench.split(":")
        figures = bench(model, scenario, args.repeat)
        payload = json.dumps(figures, indent=1)
        print(payload)
        if args.json and args.json != "-":
            Path(args.json).write_text(payload + "\n", encoding="utf-8")
        return 0
    rows: list[Row] = []
    streamed: list[Row] = []
    for engine_name in args.engines.split(","):
        if args.releases == "ci":
            versions = CI_RELEASES[engine_name]
        elif args.releases:
            versions = args.releases.split(",")
        else:
            versions = [r.version for r in fetch.list_releases(engine_name)]
        for version in versions:
            row = check_release(engine_name, version)
            stream = check_release(engine_name, version, "st")
            rows.append(row)
            streamed.append(stream)
            print(f"{row.spec}: {row.verdict()} | streaming: {stream.verdict()} [{row.seconds + stream.seconds:.1f} s]",
                  file=sys.stderr, flush=True)
    if args.docs:
        write_docs_table(rows, streamed)
    if args.json:
        payload = json.dumps([{**r.to_json(), "streaming": s.to_json()} for r, s in zip(rows, streamed)], indent=1,
                             ensure_ascii=False)
        if args.json == "-":
            print(payload)
        else:
            Path(args.json).write_text(payload + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
