"""`python -m engine bench`: what the drift matrix costs, measured in one run on the same inputs.

Figures: cold start (every default model's template and tokenizer loaded fresh), the full default matrix with
every cache emptied first, the median cell, the floor (the distinct strings the matrix tokenizes, each tokenized
whole by the tokenizer library, nothing cached), the same distinct requests rendered once, peak RSS, a cell
recomputed after a kwarg toggle with the caches warm (the web app's click), and a naive baseline: transformers'
`apply_chat_template(..., tokenize=True)` on every request, nothing cached. Then `long_session`: agent sessions of
50, 200 and 1,000 tool calls for two models, each in a fresh process (wall, template renders, peak RSS, the ratio to
the floor of tokenizing only the distinct new text, and how each grows with the session). The figures a ratio
divides are timed in rounds, each once a round and the best of each kept, so that the machine's drift in speed moves
none of them alone. A benchmark, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError
from engine.matrix import MatrixRequest, default_request, run_matrix
from engine.models import LoadedModel, load_model, load_spec, special_token_vars
from engine.render.cache import RENDER_METHODS, watching_renders
from engine.serving.real.results import result_cache
from engine.simulate import run_cell, run_cell_with
from engine.tokenize import clear_loaded_tokenizers, token_ids
from engine.watch.overhead import BUSY_SERVER, UpstreamPacing, watch_overhead, watch_text

ROOT = Path(__file__).resolve().parent.parent  # the naive baseline's process imports `engine` from here


@dataclass
class BenchReport:
    date: str
    machine: str
    cpu_count: int
    load_average_before: tuple[float, float, float]
    load_average_after: tuple[float, float, float]
    repeat: int
    # Cold start: load_model for every default model with every loader cache emptied.
    cold_start_s: float
    cold_start_models_s: dict[str, float]
    cold_start_includes_imports: bool  # transformers etc. were first imported during it (a fresh process)
    # The figures the ratios divide (the matrix in its four forms, the floor, the render and the naive baseline) are
    # timed once a round, `repeat` rounds one after another, the best of each kept (run_bench: _rounds).
    # The full default matrix, every cache in memory (cells, renders, strings, segments) emptied before each run, the
    # persisted ones warm (the releases' answers, proved causes, the templates' kept prompts: engine/render_store.py,
    # read from disk as a fresh process reads them); best run.
    cells: int
    matrix_s: float
    matrix_runs_s: list[float]
    # Each round's own ratios (that round's matrix / floor, naive / matrix, cold / floor): how far the machine's
    # drift moved them within this run, beside the ratios of the bests.
    ratios_by_round: dict[str, list[float]]
    cell_median_ms: float
    cell_max_ms: float
    # The same matrix without the persisted result cache, every release's worker stopped first: what a first run
    # pays for the real code (worker start-up and every parse and request-side render asked anew, every prompt
    # rendered); best run.
    matrix_cold_s: float
    ratio_cold_to_floor: float | None
    # That run's CPU seconds: the explorer's process (every thread, user and system; and the system part alone), each
    # release's worker, their total; and the total over this machine's cores, the least wall any sharing of that work
    # between them could take (a cold run is bound by it when the cores are busy throughout), beside the floor.
    matrix_cold_cpu_s: dict[str, Any]
    cold_cpu_bound_s: float
    ratio_cold_cpu_bound_to_floor: float | None
    # The same matrix without causes (status and prefixes only, as the web app's grid shows it); best run.
    matrix_without_causes_s: float
    # The same matrix with every cause searched for anew (the store of proved causes off, engine/cause_store.py; all
    # else warm): what a run pays when every cell's break is new to it; best run. Blame's share is what the search
    # adds to it. matrix_s reads the causes the store holds for cells that break exactly as they broke.
    matrix_causes_searched_s: float
    ratio_causes_searched_to_floor: float | None
    speedup_causes_searched_vs_naive: float | None
    blame_share: float
    result_cache: dict[str, int]  # hits, misses, rejected of the persisted result cache over the bench
    # The floor: each distinct string the matrix tokenizes, tokenized whole by the library; best pass.
    distinct_strings: int
    tokens: int
    characters: int
    floor_s: float
    floor_project_s: float  # the same strings through the project's whole-string encode (ids + char offsets)
    ratio_to_floor: float | None
    # Rendering: each distinct request the matrix renders, rendered once by its template (text only, as the matrix
    # renders first, uncached, never read from the store of prompts); best pass. Then the same with the per-character
    # provenance read (the recording render too), and how many of the matrix's distinct renders had their provenance
    # read (the bridge, and blame at a break).
    render_calls: int
    distinct_renders: int
    render_s: float
    ratio_to_render_and_floor: float
    render_with_provenance_s: float
    provenance_read: int
    # Naive: apply_chat_template(tokenize=True) per request; "all" = every render call of the matrix (cells and
    # cause attribution's re-runs), "cells" = only the cells' own requests.
    naive_s: float | None  # None with --no-naive
    naive_requests: int
    speedup_vs_naive: float | None
    naive_cells_s: float | None
    naive_cell_requests: int
    naive_paths: dict[str, str]
    naive_ids_differ: int  # requests whose naive ids differ from the matrix's (should be 0)
    naive_ids_compared: int  # distinct requests both rendered (the others refused by either)
    # The web app's click: one cell recomputed with a boolean kwarg flipped, caches warm from the matrix.
    toggle_cells: int
    toggle_median_ms: float | None  # None when no model has a boolean kwarg
    toggle_max_ms: float | None
    toggle_kwargs: dict[str, str]
    # Memory: high-water RSS with all default models loaded, the matrix run and the toggles.
    peak_rss_mb: float
    naive_peak_rss_mb: float | None  # the naive baseline's own process (NaiveProcess); None with --no-naive
    segment_reuse: dict[str, str]
    cache_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    # Where tokenization does dominate: the prompts of long random conversations (engine.fuzz), each string
    # tokenized whole by the library vs by the segment cache starting empty.
    long_conversations: dict[str, Any] = field(default_factory=dict)
    # Long agent sessions (N read_file calls) per model, each point in a fresh process: wall, renders, floor, RSS.
    long_session: dict[str, Any] = field(default_factory=dict)
    # The drift watch in front of a replay upstream: added latency per request at N concurrent sessions, its RSS.
    watch: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RenderRequest:
    messages: list[dict]
    tools: list[dict] | None
    add_generation_prompt: bool
    kwargs: dict | None


def peak_rss_mb(field: str = "VmHWM") -> float:
    """High-water resident set size of this process (VmHWM; "VmRSS": the current one), in MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def machine_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores), {platform.system()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), {platform.system()}"


def clear_run_caches(model_ids: tuple[str, ...]) -> None:
    """Empty every cache the matrix fills in memory: cells, renders, whole strings and segments, and the real
    releases' answers kept in memory (the persisted ones stay: a warm run reads them from disk, as a fresh process
    does)."""
    from engine import simulate

    simulate._cached_cell.cache_clear()
    result_cache().clear_memory()
    for model_id in model_ids:
        model = load_model(model_id)
        for part in (model.renderer, model.tokenizer):
            clear = getattr(part, "cache_clear", None)
            if clear is not None:
                clear()


def cold_start(model_ids: tuple[str, ...]) -> tuple[float, dict[str, float], bool]:
    fresh_imports = "transformers" not in sys.modules
    load_spec.cache_clear()
    load_model.cache_clear()
    clear_loaded_tokenizers()
    from engine import simulate

    simulate._cached_cell.cache_clear()
    per_model: dict[str, float] = {}
    start = time.perf_counter()
    for model_id in model_ids:
        begin = time.perf_counter()
        load_model(model_id)
        per_model[model_id] = time.perf_counter() - begin
    return time.perf_counter() - start, per_model, fresh_imports


class _Recorder:
    """Wraps each model's tokenizer and renderer instance for one run: the strings tokenized, the requests rendered."""

    def __init__(self, model_ids: tuple[str, ...]) -> None:
        self.model_ids = model_ids
        self.strings: dict[str, dict[str, None]] = {m: {} for m in model_ids}
        self.requests: dict[str, list[RenderRequest]] = {m: [] for m in model_ids}
        self._renders = contextlib.ExitStack()

    def __enter__(self) -> _Recorder:
        for model_id in self.model_ids:
            model = load_model(model_id)
            self._renders.enter_context(watching_renders(
                model.renderer, lambda *request, _requests=self.requests[model_id]: _requests.append(
                    RenderRequest(*request))))
            tokenizer = model.tokenizer
            if tokenizer is None:
                continue
            seen = self.strings[model_id]
            for method in ("encode", "encode_ids"):
                original = getattr(tokenizer, method, None)
                if original is None:
                    continue

                def recording(text: str, _original=original, _seen=seen):
                    _seen[text] = None
                    return _original(text)

                setattr(tokenizer, method, recording)
        return self

    def __exit__(self, *exc: object) -> None:
        self._renders.close()
        for model_id in self.model_ids:
            model = load_model(model_id)
            if model.tokenizer is not None:
                for method in ("encode", "encode_ids"):
                    model.tokenizer.__dict__.pop(method, None)


def _library_encoder(model: LoadedModel) -> Callable[[str], Any]:
    """Whole-string tokenization by the library alone: no wrapper, no offsets post-processing, no cache."""
    from engine.tokenize import HFTokenizer

    inner = getattr(model.tokenizer, "inner", model.tokenizer)
    if isinstance(inner, HFTokenizer):
        backend = inner.backend
        return lambda text: backend.encode(text, add_special_tokens=False)
    backend = inner.backend  # a tiktoken Encoding
    return lambda text: backend.encode(text, allowed_special="all")


def _provenance_read(renderer: Any) -> int:
    """How many renders in a render cache had their per-character provenance read."""
    memo = getattr(renderer, "_memo", {})
    return sum(rendered.provenance_computed for rendered in memo.values())


def _timed(run: Callable[[], object]) -> Callable[[], float]:
    """`run`, returning the seconds it took."""
    def timed() -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    return timed


def _best(passes: int, run: Callable[[], object]) -> float:
    return min(_timed(run)() for _ in range(passes))


def _rounds(repeat: int, passes: dict[str, Callable[[], float]],
            progress: Callable[[str], None]) -> dict[str, list[float]]:
    """`repeat` rounds, each running every pass once in order; each pass's seconds, round by round."""
    times: dict[str, list[float]] = {name: [] for name in passes}
    for number in range(repeat):
        progress(f"round {number + 1} of {repeat}")
        for name, timed in passes.items():
            times[name].append(timed())
    return times


def _ratios_by_round(rounds: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each round's matrix / floor, naive / matrix and cold / floor (a ratio over a pass that took no time left out:
    a matrix of models without a tokenizer has no floor)."""
    ratios = {"matrix_to_floor": ("matrix", "floor"), "naive_to_matrix": ("naive", "matrix"),
              "cold_to_floor": ("matrix_cold", "floor")}
    return {name: [round(a / b, 2) for a, b in zip(rounds[top], rounds[bottom]) if b > 0]
            for name, (top, bottom) in ratios.items() if top in rounds}


def naive_path(model: LoadedModel) -> tuple[str, Callable[[RenderRequest], list[int] | str]]:
    """How a user would render + tokenize one request by hand for this model, built offline from the same files."""
    from engine.assets import resolve_asset

    spec = model.spec
    renderer = getattr(model.renderer, "inner", model.renderer)
    kind = type(renderer).__name__
    tokenizer_kind = spec.assets["tokenizer"].kind if "tokenizer" in spec.assets else ""
    hf = None
    if model.tokenizer is not None and tokenizer_kind == "tokenizer.json":
        from tokenizers import Tokenizer as RustTokenizer
        from transformers import PreTrainedTokenizerFast

        data = resolve_asset(spec.id, spec.hub_repo, spec.assets["tokenizer"]).data.decode("utf-8")
        template = None
        if kind == "JinjaRenderer":
            template = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"]).data.decode("utf-8")
        hf = PreTrainedTokenizerFast(tokenizer_object=RustTokenizer.from_str(data), chat_template=template,
                                     **special_token_vars(model.spec))
    if kind == "JinjaRenderer" and hf is not None:
        def by_hand(r: RenderRequest) -> list[int] | str:
            out = hf.apply_chat_template(r.messages, tools=r.tools, add_generation_prompt=r.add_generation_prompt,
                                         tokenize=True, **(r.kwargs or {}))
            return list(out["input_ids"])

        return "transformers PreTrainedTokenizerFast(tokenizer.json + chat template).apply_chat_template(" \
               "tokenize=True)", by_hand
    if kind == "JinjaRenderer":
        encode = _library_encoder(model) if model.tokenizer is not None else None

        def render_then_encode(r: RenderRequest) -> list[int] | str:
            text = renderer.render_reference(r.messages, r.tools, add_generation_prompt=r.add_generation_prompt,
                                             kwargs=r.kwargs)
            return text if encode is None else list(encode(text))

        if encode is None:
            return "transformers render_jinja_template only (string level: no tokenizer offline)", render_then_encode
        return "transformers render_jinja_template, then tiktoken encode of the whole string (no tokenizer.json " \
               "exists for this tokenizer)", render_then_encode
    if kind == "DeepSeekV4Renderer" and hf is not None:
        from engine.render.deepseek_v4 import load_encoder_module

        encoder = load_encoder_module(resolve_asset(spec.id, spec.hub_repo, spec.assets["encoder"]).path)

        def encode_then_tokenize(r: RenderRequest) -> list[int] | str:
            request = renderer.prepare(r.messages, r.tools, r.kwargs or {})
            text = encoder.encode_messages(request["messages"], thinking_mode=request["thinking_mode"],
                                           drop_thinking=request["drop_thinking"],
                                           reasoning_effort=request["reasoning_effort"])
            return hf.encode(text, add_special_tokens=False)

        return "the official encoder's encode_messages (untraced), then transformers tokenizer.encode of the " \
               "whole string (no Jinja template exists)", encode_then_tokenize
    encode = _library_encoder(model) if model.tokenizer is not None else None

    def project_render(r: RenderRequest) -> list[int] | str:
        text = renderer.render(r.messages, r.tools, add_generation_prompt=r.add_generation_prompt,
                               kwargs=r.kwargs).text
        return text if encode is None else list(encode(text))

    return f"the project's {kind} (uncached), then the tokenizer library on the whole string", project_render


def _ours(model: LoadedModel, r: RenderRequest) -> list[int] | str:
    text = model.renderer.render(r.messages, r.tools, add_generation_prompt=r.add_generation_prompt,
                                 kwargs=r.kwargs).text
    return text if model.tokenizer is None else list(token_ids(model.tokenizer, text))


def _naive(model_ids: tuple[str, ...], requests: dict[str, list[RenderRequest]],
           paths: dict[str, tuple[str, Callable]]) -> float:
    # One untimed request per model first: transformers compiles a template once per process (its own lru_cache),
    # as the matrix's renderers compile theirs at load time, outside the timed run.
    for model_id in model_ids:
        if requests[model_id]:
            try:
                paths[model_id][1](requests[model_id][0])
            except Exception:  # noqa: BLE001 - refusals are timed below like any request
                pass
    start = time.perf_counter()
    for model_id in model_ids:
        by_hand = paths[model_id][1]
        for request in requests[model_id]:
            try:
                by_hand(request)
            except Exception:  # noqa: BLE001 - a template that refuses a request fails for the user too; time it
                pass
    return time.perf_counter() - start


def _output_digest(output: list[int] | str) -> str:
    return hashlib.sha256(json.dumps(output).encode()).hexdigest()


class NaiveProcess:
    """The naive baseline in a process of its own, timed on demand. In this process, its transformers tokenizers
    (a second copy of every tokenizer, about 500 MB) slowed the tokenizer library's encode of the matrix's own
    tokenizers: the floor took 1.2 s before they were built and 1.85-2.2 s with them alive, 1.35 s once they were
    dropped. The rounds time the floor and the matrix beside the baseline, so it lives elsewhere."""

    def __init__(self, models: tuple[str, ...], requests: dict[str, dict[str, list[RenderRequest]]],
                 distinct: dict[str, list[RenderRequest]]) -> None:
        """`requests`: the request sets to time, by name; `distinct`: the requests whose ids `digests` gives."""
        self.proc = subprocess.Popen([sys.executable, "-c", "from engine.bench import naive_process; naive_process()"],
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._ask({"models": list(models), "distinct": {m: [vars(r) for r in rs] for m, rs in distinct.items()},
                           "requests": {name: {m: [vars(r) for r in rs] for m, rs in by_model.items()}
                                        for name, by_model in requests.items()}})
        self.paths: dict[str, str] = ready["paths"]
        self.digests: dict[str, list[str | None]] = ready["digests"]  # None: the request was refused

    def _ask(self, message: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ExplorerError(f"bench: the naive baseline's process exited with status {self.proc.wait()} (its "
                                "error is above)")
        return json.loads(line)

    def seconds(self, name: str) -> float:
        """One timed pass over the request set `name`."""
        return self._ask({"time": name})["seconds"]

    def peak_rss_mb(self) -> float:
        return self._ask({"peak_rss_mb": True})["peak_rss_mb"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def naive_process() -> None:
    """The naive baseline's process (NaiveProcess): one JSON message a line on stdin, one reply a line on stdout."""
    setup = json.loads(sys.stdin.readline())
    models = tuple(setup["models"])
    sets = {name: {m: [RenderRequest(**r) for r in rs] for m, rs in by_model.items()}
            for name, by_model in setup["requests"].items()}
    paths = {m: naive_path(load_model(m)) for m in models}
    digests: dict[str, list[str | None]] = {}
    for model_id, raws in setup["distinct"].items():
        digests[model_id] = []
        for raw in raws:
            try:
                digests[model_id].append(_output_digest(paths[model_id][1](RenderRequest(**raw))))
            except Exception:  # noqa: BLE001 - a refusal: compared with nothing
                digests[model_id].append(None)
    print(json.dumps({"paths": {m: p[0] for m, p in paths.items()}, "digests": digests}), flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        if "time" in message:
            reply: dict[str, Any] = {"seconds": _naive(models, sets[message["time"]], paths)}
        else:
            reply = {"peak_rss_mb": peak_rss_mb()}
        print(json.dumps(reply), flush=True)


def _cell_requests(request: MatrixRequest) -> dict[str, list[RenderRequest]]:
    """The requests of the cells alone (no cause attribution re-runs)."""
    with _Recorder(request.models) as recorder:
        for model_id in request.models:
            model = load_model(model_id)
            for scenario in request.scenarios:
                for engine in request.engines:
                    run_cell_with(model, scenario, engine, request.kwargs.get(model_id, {}), explain=False)
    return recorder.requests


def _toggles(request: MatrixRequest) -> tuple[list[float], dict[str, str]]:
    times: list[float] = []
    toggled: dict[str, str] = {}
    for model_id in request.models:
        spec = load_spec(model_id)
        kwarg = next((k for k in spec.template_kwargs if isinstance(k.default, bool)), None)
        if kwarg is None:
            continue
        toggled[model_id] = f"{kwarg.name}={'false' if kwarg.default else 'true'}"
        for scenario in request.scenarios:
            for engine in request.engines:
                kwargs = {**request.kwargs.get(model_id, {}), kwarg.name: not kwarg.default}
                start = time.perf_counter()
                run_cell(model_id, scenario, engine, kwargs)
                times.append(time.perf_counter() - start)
    return times, toggled


def long_conversation_tokenization(model_id: str = "qwen3.6", conversations: int = 40, repeat: int = 3) -> dict:
    """Whole-string vs segment-cached tokenization of the strings of `conversations` fuzz conversations."""
    from engine.fuzz import random_scenario
    from engine.tokenize import SegmentCachedTokenizer

    model = load_model(model_id)
    tokenizer = model.tokenizer
    if not isinstance(tokenizer, SegmentCachedTokenizer):
        return {}
    texts: dict[str, None] = {}
    for index in range(conversations):
        scenario = random_scenario(model.spec.family, 0, index)
        cell = run_cell_with(model, scenario, "raw", {}, explain=False)
        for b in cell.boundaries:
            for text in (b.prev_prompt.text, b.completion.text, b.next_prompt.text):
                texts[text] = None
    strings = list(texts)
    encode = _library_encoder(model)
    whole_s = _best(repeat, lambda: [encode(t) for t in strings])
    wrappers = [SegmentCachedTokenizer(tokenizer.inner, tokenizer.plan) for _ in range(repeat)]
    passes = iter(wrappers)
    segmented_s = _best(repeat, lambda: [w.encode_ids(t) for w in (next(passes),) for t in strings])
    return {"model": model_id, "conversations": conversations, "strings": len(strings),
            "tokens": sum(len(wrappers[0].encode_ids(t)) for t in strings), "whole_s": round(whole_s, 4),
            "segmented_s": round(segmented_s, 4), "speedup": round(whole_s / segmented_s, 2)}


def long_session_script(calls: int, follow_up: bool = False) -> dict[str, Any]:
    """A session script (the JSON shape of scenarios/sessions/) of an agent reading `calls` files: one user task,
    then per call a short reasoning, one `read_file` call and a 40-line result; the last reply answers (with
    `follow_up`, a next user question follows it). The shape issue 19 measured (about 480 Qwen3.6 tokens per call);
    deterministic, so a golden file can pin its figures."""
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the workspace and return its text",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "a relative path"}},
                       "required": ["path"]}}}]
    steps: list[dict[str, Any]] = [{"role": "user", "content": f"Review the {calls} modules under src/pkg/ for "
                                    "functions that swallow exceptions, and list each one with its file and line."}]
    for call in range(calls):
        path = f"src/pkg/module_{call:04d}.py"
        lines = [f'"""Module {call}: helpers for stage {call % 7} of the pipeline."""', "", "import logging", ""]
        for k in range(36):
            n = call * 36 + k
            if k % 6 == 0:
                lines.append(f"def step_{n}(items, limit={n % 97}):")
            elif k % 6 == 5:
                lines.append("    return [x for x in items if x < limit]")
            else:
                lines.append(f"    total += items[{k}]")
        steps.append({"role": "assistant",
                      "reasoning_content": f"Next I read {path} to check its handlers ({call + 1} of {calls}).",
                      "content": "", "tool_calls": [{"id": f"call_{call:04d}", "type": "function", "function": {
                          "name": "read_file", "arguments": {"path": path}}}]})
        steps.append({"role": "tool", "tool_call_id": f"call_{call:04d}", "content": "\n".join(lines)})
    steps.append({"role": "assistant", "reasoning_content": "Every module is read; none swallows an exception.",
                  "content": f"I read all {calls} modules: no function swallows an exception."})
    if follow_up:  # a next user question: templates that drop earlier reasoning break the prefix here
        steps.append({"role": "user", "content": "Which module was the longest?"})
    return {"id": f"long-session-{calls}" + ("-follow-up" if follow_up else ""),
            "description": f"An agent reading {calls} files, one read_file call each",
            "tools": tools, "system": "You are a careful code reviewer with access to the workspace.",
            "steps": steps}


LONG_SESSION_MODELS = ("qwen3.6", "glm-5.1")
LONG_SESSION_CALLS = (50, 200, 1000)


def long_session_point(model_id: str, calls: int, repeat: int = 3) -> dict[str, Any]:
    """One point of the `long_session` section, measured in this process (`long_session` runs each in a fresh one,
    so that its peak RSS is its own): the session of `calls` read_file calls simulated `repeat` times (more for a
    short one, `runs`), every cache empty before each, the fastest run's wall and the time its template renders
    took; the session again with its renders replayed (`simulator_s`, the fastest of as many); and the floor, the
    library tokenizing whole only the distinct new text of the run (each text the session tokenizes, from where it
    stops agreeing with the text before it), the fastest of three. The memory figures are the first run's."""
    from engine.session import session_from_json, simulate_session

    model = load_model(model_id)
    script = session_from_json(long_session_script(calls), f"engine.bench.long_session_script({calls})")
    tokenizer, renderer = model.tokenizer, getattr(model.renderer, "inner", model.renderer)
    if hasattr(renderer, "incremental_stats"):
        renderer.incremental_stats()  # compiles the incremental template, as loading compiled the template itself
    new_texts: list[str] = []
    render_s = [0.0]
    extending, rendering = tokenizer.encode_extending, renderer.render

    def record_text(text, previous=None, known=0):
        tokenized = extending(text, previous, known)
        new_texts.append(tokenized.chars.tail)  # the text from where it stops agreeing with `previous`
        return tokenized

    def timed_render(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return rendering(*args, **kwargs)
        finally:
            render_s[0] += time.perf_counter() - begin

    runs: list[tuple[float, float]] = []  # (wall, of which renders)
    tokenizer.encode_extending, renderer.render = record_text, timed_render
    try:
        attempt = 0
        # `repeat` runs, and more of a short session until they add up to a second (at most 20), so that a point
        # of 0.1 s is as steady as one of seconds (timeit's autorange).
        while attempt < max(repeat, 1) or (attempt < 20 and sum(wall for wall, _ in runs) < 1.0):
            model.renderer.cache_clear()  # and the renderer's own caches (a Jinja renderer's converted messages)
            tokenizer.cache_clear()
            new_texts.clear()
            render_s[0] = 0.0
            if not attempt:
                rss_loaded = peak_rss_mb("VmRSS")
            start = time.perf_counter()
            report = simulate_session(model, script)
            runs.append((time.perf_counter() - start, render_s[0]))
            if not attempt:
                rss_session = peak_rss_mb("VmRSS")  # the report still held
                peak_rss = peak_rss_mb()
                rows, prompt_tokens = len(report.rows), report.total_prompt_tokens
                last_prompt = report.rows[-1].prompt_tokens
                # How the template renders went: resumed from the previous render's recorded loop iterations, or
                # in full (engine.render.incremental); a renderer without that path (DeepSeek V4's encoder) says
                # nothing.
                incremental = renderer.incremental_stats() if hasattr(renderer, "incremental_stats") else None
            del report
            attempt += 1
    finally:
        del tokenizer.encode_extending, renderer.render
    wall_s, renders_s = min(runs)
    simulator_s = _without_renders(model, script, len(runs))
    encode = _library_encoder(model)
    floor_s = _best(3, lambda: [encode(t) for t in new_texts])
    return {
        "model": model_id, "calls": calls, "requests": rows, "last_prompt_tokens": last_prompt,
        "prompt_tokens": prompt_tokens, "runs": len(runs),
        "new_characters": sum(map(len, new_texts)), "new_tokens": sum(len(encode(t)) for t in new_texts),
        "wall_s": round(wall_s, 4), "render_s": round(renders_s, 4), "floor_s": round(floor_s, 4),
        "ratio_to_floor": round(wall_s / floor_s, 2) if floor_s else None,
        "ratio_to_render_and_floor": round(wall_s / (renders_s + floor_s), 2),
        "simulator_s": round(simulator_s, 4), "simulator_ratio_to_floor": round(simulator_s / floor_s, 2),
        "peak_rss_mb": round(peak_rss, 1), "rss_after_loading_mb": round(rss_loaded, 1),
        "rss_with_report_mb": round(rss_session, 1), "incremental_render": incremental,
    }


def _without_renders(model: LoadedModel, script: Any, repeat: int = 1) -> float:
    """The session's wall with every template render answered, in order, from a first run's (the same real
    renders), the fastest of `repeat`: what the simulator itself costs on top of the template. Run after the RSS
    figures are taken, since it holds every request's text."""
    from engine.session import simulate_session

    renderer = getattr(model.renderer, "inner", model.renderer)
    rendering = renderer.render
    done: list[tuple[int, bool, Any]] = []

    def keep(messages, tools, *, add_generation_prompt, kwargs=None):
        rendered = rendering(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        done.append((len(messages), add_generation_prompt, rendered))
        return rendered

    answers = iter(done)

    def replay(messages, tools, *, add_generation_prompt, kwargs=None):
        count, generation_prompt, rendered = next(answers)
        if (count, generation_prompt) != (len(messages), add_generation_prompt):
            raise RuntimeError("the session asked for its renders in another order the second time")
        return rendered

    def replayed() -> None:
        nonlocal answers
        model.tokenizer.cache_clear()
        answers = iter(done)
        simulate_session(model, script)

    renderer.render = keep
    try:
        simulate_session(model, script)
        renderer.render = replay
        return _best(max(repeat, 1), replayed)
    finally:
        del renderer.render


def growth_exponent(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of log(cost) over log(size): 1 is linear, 2 quadratic."""
    import math

    pairs = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pairs) < 2:
        return None
    mean_x = sum(x for x, _ in pairs) / len(pairs)
    mean_y = sum(y for _, y in pairs) / len(pairs)
    spread = sum((x - mean_x) ** 2 for x, _ in pairs)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in pairs) / spread, 3) if spread else None


def long_session(models: tuple[str, ...] = LONG_SESSION_MODELS, calls: tuple[int, ...] = LONG_SESSION_CALLS,
                 progress: Callable[[str], None] | None = None, timeout_s: float = 1800,
                 repeat: int = 3, processes: int = 2) -> dict[str, Any]:
    """Long agent sessions (`long_session_script`): each (model, calls) point measured in a fresh process (the
    fastest of `repeat` runs, as every figure of the bench), the faster of `processes` such processes (in rounds
    over every point); and per model the growth exponents of wall, of the renders, of the rest, of the session with
    its renders replayed, and of the memory the session adds (RSS with its report held, less RSS after loading the
    model)."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    points: list[dict[str, Any]] = []
    code = ("import json, sys; from engine.bench import long_session_point; "
            "print(json.dumps(long_session_point(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))")
    tried: dict[tuple[str, int], list[dict[str, Any]]] = {(m, n): [] for m in models for n in calls}
    # Fresh processes, the fastest kept: the same work runs up to a quarter slower in one process than in the next
    # on a shared machine (the floor too), which runs inside a process do not even out; the rounds go through every
    # point in turn, so that a slow minute of the machine does not fall on both of one point's processes.
    for _ in range(max(processes, 1)):
        for (model_id, n), mine in tried.items():
            if mine and "error" in mine[-1]:
                continue
            if progress:
                progress(f"long session: {model_id}, {n} tool calls (a fresh process)")
            try:
                run = subprocess.run([sys.executable, "-c", code, model_id, str(n), str(repeat)], cwd=root,
                                     capture_output=True, text=True, timeout=timeout_s)
                point = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else \
                    {"model": model_id, "calls": n, "error": (run.stderr.strip().splitlines() or ["failed"])[-1]}
            except subprocess.TimeoutExpired:
                point = {"model": model_id, "calls": n, "error": f"took over {timeout_s:.0f} s"}
            mine.append(point)
    for mine in tried.values():
        errors = [p for p in mine if "error" in p]
        points.append(errors[0] if errors else {**min(mine, key=lambda p: p["wall_s"]), "processes": len(mine)})
    exponents: dict[str, dict[str, float | None]] = {}
    for model_id in models:
        mine = [p for p in points if p["model"] == model_id and "error" not in p]
        exponents[model_id] = {
            "wall": growth_exponent([(p["calls"], p["wall_s"]) for p in mine]),
            "render": growth_exponent([(p["calls"], p["render_s"]) for p in mine]),
            "wall_without_render": growth_exponent([(p["calls"], p["wall_s"] - p["render_s"]) for p in mine]),
            "simulator": growth_exponent([(p["calls"], p["simulator_s"]) for p in mine]),
            "session_rss": growth_exponent([(p["calls"], p["rss_with_report_mb"] - p["rss_after_loading_mb"])
                                            for p in mine]),
        }
    return {"script": "engine.bench.long_session_script (one read_file call and a 40-line result per call)",
            "models": list(models), "calls": list(calls), "points": points, "growth_exponent": exponents}


def _cold_matrix(request: MatrixRequest, under: Path, cpu: list[dict[str, Any]]) -> float:
    """The matrix as on a machine whose result cache is empty: every release answer asked of a worker started for
    it (once per job: what the run asks again it has cached by then), written to a new, empty result cache in a
    folder of its own under `under`. Appends to `cpu` the CPU seconds the run took in the explorer's process (every
    thread, user and system) and in each release's worker (alive at its end: started by it).

    The caller deletes `under` after the last round, not each round's cache after its run: on ext4, a file created
    within minutes of thousands deleted nearby costs a scan past them (the kernel's `recently_deleted`). While the
    cache kept a file per answer (some 3,300 a cold run), a round that followed the deletion of the one before spent
    up to 3.7 s of system time creating them, against 0.6-0.9 s beside none deleted. Its packs are a few files a
    fingerprint now (results.py), but what the run creates should still not depend on what the bench deleted."""
    from engine.serving.real.backend import stop_workers, worker_cpu_s

    clear_run_caches(request.models)
    stop_workers()
    with _environment("DRIFT_RESULT_CACHE_DIR", tempfile.mkdtemp(prefix="round-", dir=under)):
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        run_matrix(request)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        workers = worker_cpu_s()
        cpu.append({"explorer": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
                    "explorer_system": after.ru_stime - before.ru_stime, "workers": workers})
        # The answers this cache holds in memory are never read again (about 49,000 objects a round, which every
        # later full collection would walk)
        result_cache().clear_memory()
        return elapsed


def _causes_searched() -> contextlib.AbstractContextManager[None]:
    """Every cause searched for, none read from the store of proved causes (engine/cause_store.py)."""
    return _environment("DRIFT_CAUSE_STORE", "0")


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` in this process's environment while the block runs, as it was after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run_bench(request: MatrixRequest | None = None, *, repeat: int = 3, naive: bool = True,
              long_session_calls: tuple[int, ...] = LONG_SESSION_CALLS,
              long_session_models: tuple[str, ...] = LONG_SESSION_MODELS, watch_sessions: int = 0,
              watch_pacing: UpstreamPacing = BUSY_SERVER,
              progress: Callable[[str], None] = _progress) -> BenchReport:
    request = request or default_request()
    models = request.models
    load_before = os.getloadavg()
    results = result_cache()
    progress("cold start")
    cold_s, cold_models, fresh_imports = cold_start(models)

    progress("recording the strings and requests of one matrix run (every cause searched)")
    clear_run_caches(models)
    # The work a matrix with full causes does, blame's re-renders included, whatever the store of proved causes holds:
    # the floor and the naive baseline are measured on it
    with _Recorder(models) as recorder, _causes_searched():
        cells = run_matrix(request)
    asked = sum(load_model(m).renderer.hits + load_model(m).renderer.misses for m in models)
    recorded = sum(map(len, recorder.requests.values()))
    if asked != recorded:  # the baseline must render what the matrix renders
        raise ExplorerError(f"the bench recorded {recorded} of the matrix's {asked} render calls: it does not wrap a "
                            f"way the matrix renders ({', '.join(RENDER_METHODS)})")
    stats = {}
    for model_id in models:
        tokenizer = load_model(model_id).tokenizer
        if tokenizer is not None and hasattr(tokenizer, "cache_stats"):
            stats[model_id] = tokenizer.cache_stats()

    provenance_read = sum(_provenance_read(load_model(m).renderer) for m in models)

    progress("cells one by one")
    clear_run_caches(models)
    run_matrix(request)  # untimed: the store of proved causes holds this matrix's, as the rounds below find it
    clear_run_caches(models)
    cell_times = []
    for model_id in models:
        for scenario in request.scenarios:
            for engine in request.engines:
                start = time.perf_counter()
                run_cell(model_id, scenario, engine, request.kwargs.get(model_id, {}))
                cell_times.append(time.perf_counter() - start)

    encoders = {m: _library_encoder(load_model(m)) for m in models if load_model(m).tokenizer is not None}
    strings = {m: list(recorder.strings[m]) for m in encoders}

    def floor_pass() -> None:
        for model_id, encode in encoders.items():
            for text in strings[model_id]:
                encode(text)

    def project_pass() -> None:
        for model_id in encoders:
            inner = getattr(load_model(model_id).tokenizer, "inner", load_model(model_id).tokenizer)
            for text in strings[model_id]:
                inner.encode(text)

    progress("the project's whole-string encode of the floor's strings")
    floor_project_s = _best(repeat, project_pass)
    tokens = sum(len(load_model(m).tokenizer.encode_ids(t)) for m in encoders for t in strings[m])
    characters = sum(len(t) for m in encoders for t in strings[m])

    distinct: dict[str, list[RenderRequest]] = {}
    for model_id in models:
        unique = {repr((r.messages, r.tools, r.add_generation_prompt, r.kwargs)): r
                  for r in recorder.requests[model_id]}
        distinct[model_id] = list(unique.values())

    def render_pass() -> None:
        for model_id in models:
            inner = getattr(load_model(model_id).renderer, "inner", load_model(model_id).renderer)
            for r in distinct[model_id]:
                try:
                    inner.render(r.messages, r.tools, add_generation_prompt=r.add_generation_prompt, kwargs=r.kwargs)
                except Exception:  # noqa: BLE001 - the matrix renders refusals too (error cells)
                    pass

    def render_with_provenance_pass() -> None:
        for model_id in models:
            inner = getattr(load_model(model_id).renderer, "inner", load_model(model_id).renderer)
            for r in distinct[model_id]:
                try:
                    rendered = inner.render(r.messages, r.tools, add_generation_prompt=r.add_generation_prompt,
                                            kwargs=r.kwargs)
                    _ = rendered.message_index  # reading it runs the recording render
                except Exception:  # noqa: BLE001 - the matrix renders refusals too (error cells)
                    pass

    progress("rendering with provenance: distinct requests once each")
    render_with_provenance_s = _best(repeat, render_with_provenance_pass)

    progress("kwarg toggles (caches warm)")
    clear_run_caches(models)
    run_matrix(request)
    toggle_times, toggled = _toggles(request)
    rss = peak_rss_mb()

    differ = compared = 0
    cell_requests: dict[str, list[RenderRequest]] = {m: [] for m in models}
    baseline: NaiveProcess | None = None
    if naive:
        progress("naive baseline: its own process builds transformers tokenizers")
        cell_requests = _cell_requests(request)
        baseline = NaiveProcess(models, {"all": recorder.requests, "cells": cell_requests}, distinct)
        for model_id in models:
            model = load_model(model_id)
            for r, theirs in zip(distinct[model_id], baseline.digests[model_id]):
                if theirs is None:
                    continue  # the baseline refused it
                try:
                    ours = _output_digest(_ours(model, r))
                except Exception:  # noqa: BLE001 - refused by ours
                    continue
                compared += 1
                differ += theirs != ours

    def matrix_pass(explain: bool = True) -> Callable[[], float]:
        def timed() -> float:
            clear_run_caches(models)
            start = time.perf_counter()
            run_matrix(request, explain=explain)
            return time.perf_counter() - start
        return timed

    def causes_searched_pass() -> float:
        with _causes_searched():
            return matrix_pass()()

    # The figures the ratios compare, each timed once a round, the rounds one after another, the best of each kept:
    # a ratio then divides two times taken within one round of each other. This machine's speed drifts (the floor
    # 1.25-2.09 s within hours), and a figure timed once, minutes from the others, moved its ratio with it (the naive
    # baseline alone ran at 5.2-11.0x the floor across four runs of one evening).
    cold_caches = Path(tempfile.mkdtemp(prefix="drift-cold-results-"))  # each cold round's cache, kept to the end
    cold_cpu: list[dict[str, Any]] = []  # each cold round's CPU, round by round
    passes: dict[str, Callable[[], float]] = {
        "floor": _timed(floor_pass), "render": _timed(render_pass), "matrix": matrix_pass(),
        "matrix_without_causes": matrix_pass(explain=False), "matrix_causes_searched": causes_searched_pass,
        "matrix_cold": lambda: _cold_matrix(request, cold_caches, cold_cpu)}
    if baseline is not None:
        passes["naive"] = functools.partial(baseline.seconds, "all")
    progress(f"{repeat} round{'s' if repeat > 1 else ''} of: {', '.join(passes)}")
    try:
        rounds = _rounds(repeat, passes, progress)
        naive_cells_s = baseline.seconds("cells") if baseline is not None else None
        naive_rss_mb = baseline.peak_rss_mb() if baseline is not None else None
    finally:
        if baseline is not None:
            baseline.close()
        shutil.rmtree(cold_caches, ignore_errors=True)
    floor_s, render_s, matrix_s = min(rounds["floor"]), min(rounds["render"]), min(rounds["matrix"])
    matrix_without_causes_s = min(rounds["matrix_without_causes"])
    matrix_causes_searched_s = min(rounds["matrix_causes_searched"])
    matrix_cold_s = min(rounds["matrix_cold"])
    cold_round_cpu = cold_cpu[rounds["matrix_cold"].index(matrix_cold_s)]  # the CPU of the round reported
    cold_cpu_total = cold_round_cpu["explorer"] + sum(cold_round_cpu["workers"].values())
    cold_cpu_bound_s = cold_cpu_total / (os.cpu_count() or 1)
    naive_s = min(rounds["naive"]) if naive else None

    segment_reuse = {m: getattr(load_model(m).tokenizer, "segment_note", "no tokenizer") for m in models}
    long_model = next((m for m in models if load_model(m).tokenizer is not None), None)
    progress("long conversations: whole-string vs segment-cached tokenization")
    long_conversations = long_conversation_tokenization(long_model, repeat=repeat) if long_model else {}
    # Two fresh processes a point, the faster kept; one when a single run of everything is asked for (--repeat 1)
    sessions = long_session(long_session_models, long_session_calls, progress, repeat=repeat,
                            processes=min(repeat, 2)) \
        if long_session_calls else {}
    watch = watch_section(watch_sessions, progress, watch_pacing) if watch_sessions else {}
    return BenchReport(
        date=datetime.date.today().isoformat(),
        machine=machine_name(),
        cpu_count=os.cpu_count() or 1,
        load_average_before=tuple(round(x, 2) for x in load_before),
        load_average_after=tuple(round(x, 2) for x in os.getloadavg()),
        repeat=repeat,
        cold_start_s=round(cold_s, 4),
        cold_start_models_s={m: round(t, 4) for m, t in cold_models.items()},
        cold_start_includes_imports=fresh_imports,
        cells=len(cells),
        matrix_s=round(matrix_s, 4),
        matrix_runs_s=[round(t, 4) for t in rounds["matrix"]],
        ratios_by_round=_ratios_by_round(rounds),
        cell_median_ms=round(statistics.median(cell_times) * 1000, 3),
        cell_max_ms=round(max(cell_times) * 1000, 3),
        distinct_strings=sum(len(v) for v in strings.values()),
        tokens=tokens,
        characters=characters,
        floor_s=round(floor_s, 4),
        floor_project_s=round(floor_project_s, 4),
        ratio_to_floor=round(matrix_s / floor_s, 2) if floor_s else None,
        matrix_cold_s=round(matrix_cold_s, 4),
        ratio_cold_to_floor=round(matrix_cold_s / floor_s, 2) if floor_s else None,
        matrix_cold_cpu_s={"explorer": round(cold_round_cpu["explorer"], 3),
                           "explorer_system": round(cold_round_cpu["explorer_system"], 3),
                           "workers": {spec: round(t, 3) for spec, t in sorted(cold_round_cpu["workers"].items())},
                           "total": round(cold_cpu_total, 3)},
        cold_cpu_bound_s=round(cold_cpu_bound_s, 4),
        ratio_cold_cpu_bound_to_floor=round(cold_cpu_bound_s / floor_s, 2) if floor_s else None,
        matrix_without_causes_s=round(matrix_without_causes_s, 4),
        matrix_causes_searched_s=round(matrix_causes_searched_s, 4),
        ratio_causes_searched_to_floor=round(matrix_causes_searched_s / floor_s, 2) if floor_s else None,
        speedup_causes_searched_vs_naive=round(naive_s / matrix_causes_searched_s, 2) if naive_s is not None else None,
        blame_share=round(max(matrix_causes_searched_s - matrix_without_causes_s, 0.0) / matrix_causes_searched_s, 3),
        result_cache={"hits": results.hits, "misses": results.misses, "rejected": results.rejected},
        render_calls=sum(len(v) for v in recorder.requests.values()),
        distinct_renders=sum(len(v) for v in distinct.values()),
        render_s=round(render_s, 4),
        ratio_to_render_and_floor=round(matrix_s / (render_s + floor_s), 2),
        render_with_provenance_s=round(render_with_provenance_s, 4),
        provenance_read=provenance_read,
        naive_s=round(naive_s, 4) if naive_s is not None else None,
        naive_requests=sum(len(v) for v in recorder.requests.values()),
        speedup_vs_naive=round(naive_s / matrix_s, 2) if naive_s is not None else None,
        naive_cells_s=round(naive_cells_s, 4) if naive_cells_s is not None else None,
        naive_cell_requests=sum(len(v) for v in cell_requests.values()),
        naive_paths=baseline.paths if baseline is not None else {},
        naive_ids_differ=differ,
        naive_ids_compared=compared,
        toggle_cells=len(toggle_times),
        toggle_median_ms=round(statistics.median(toggle_times) * 1000, 3) if toggle_times else None,
        toggle_max_ms=round(max(toggle_times) * 1000, 3) if toggle_times else None,
        toggle_kwargs=toggled,
        peak_rss_mb=round(rss, 1),
        naive_peak_rss_mb=round(naive_rss_mb, 1) if naive_rss_mb is not None else None,
        segment_reuse=segment_reuse,
        cache_stats=stats,
        long_conversations=long_conversations,
        long_session=sessions,
        watch=watch,
    )


def watch_section(sessions: int, progress: Callable[[str], None] = _progress,
                  pacing: UpstreamPacing = BUSY_SERVER) -> dict[str, Any]:
    """engine.watch.overhead: the watch against its upstream direct, in one run; a failure is the section's note."""
    progress(f"watch: {sessions} concurrent sessions, direct and through the watch")
    try:
        return watch_overhead(sessions, pacing=pacing)
    except (OSError, RuntimeError) as err:
        return {"sessions": sessions, "error": f"the watch section did not run: {err}"}


def report_text(r: BenchReport) -> str:
    lines = [
        f"# drift-matrix bench, {r.date}, {r.machine}; load average {r.load_average_before} -> "
        f"{r.load_average_after}; best of {r.repeat}",
        f"cold start       {r.cold_start_s:8.3f} s  ({len(r.cold_start_models_s)} models"
        f"{', first imports included' if r.cold_start_includes_imports else ', imports already done'})",
        f"matrix           {r.matrix_s:8.3f} s  ({r.cells} cells; median cell {r.cell_median_ms:.2f} ms, "
        f"slowest {r.cell_max_ms:.1f} ms)",
        f"floor            {r.floor_s:8.3f} s  ({r.distinct_strings} distinct strings, {r.tokens} tokens, "
        f"{r.characters} chars, tokenized whole by the library; project encode {r.floor_project_s:.3f} s)",
    ]
    if r.ratio_to_floor is not None:
        lines.append(f"matrix / floor   {r.ratio_to_floor:8.2f} x  (the releases' answers, proved causes and "
                     f"templates' prompts from the persisted result cache: {r.result_cache['hits']} hits, "
                     f"{r.result_cache['misses']} misses, {r.result_cache['rejected']} rejected)")
    lines += [
        f"matrix, no causes {r.matrix_without_causes_s:7.3f} s",
        f"matrix, every cause searched {r.matrix_causes_searched_s:.3f} s  ({r.ratio_causes_searched_to_floor} x the "
        f"floor; blame's share: {100 * r.blame_share:.0f} %; matrix_s reads the causes proved before from their "
        "store)",
        f"matrix cold      {r.matrix_cold_s:8.3f} s  (an empty result cache, workers stopped first; "
        f"{r.ratio_cold_to_floor} x the floor)",
        f"matrix cold, CPU {r.matrix_cold_cpu_s['total']:8.3f} s  (explorer {r.matrix_cold_cpu_s['explorer']:.3f} s, "
        f"{r.matrix_cold_cpu_s['explorer_system']:.3f} s of it in the kernel"
        + "".join(f", {spec} {t:.3f} s" for spec, t in r.matrix_cold_cpu_s["workers"].items())
        + f"; over {r.cpu_count} cores at least {r.cold_cpu_bound_s:.3f} s, {r.ratio_cold_cpu_bound_to_floor} x the "
        "floor)",
        "each round's     " + "; ".join(f"{name.replace('_to_', ' / ')} {', '.join(f'{x:.2f}' for x in values)}"
                                       for name, values in r.ratios_by_round.items()),
    ]
    lines += [
        f"render once      {r.render_s:8.3f} s  ({r.distinct_renders} distinct of {r.render_calls} render calls; "
        f"with provenance {r.render_with_provenance_s:.3f} s, read by the matrix for {r.provenance_read})",
        f"matrix / (render once + floor) {r.ratio_to_render_and_floor:.2f} x",
    ]
    if r.naive_s is not None and r.naive_cells_s is not None and r.speedup_vs_naive is not None:
        lines += [
            f"naive            {r.naive_s:8.3f} s  ({r.naive_requests} requests; cells only: {r.naive_cells_s:.3f} s "
            f"for {r.naive_cell_requests}); ids differing from the matrix: {r.naive_ids_differ} of "
            f"{r.naive_ids_compared} distinct requests",
            f"naive / matrix   {r.speedup_vs_naive:8.2f} x  (every cause searched: "
            f"{r.speedup_causes_searched_vs_naive} x)",
        ]
    else:
        lines.append("naive            skipped (--no-naive)")
    if r.toggle_median_ms is not None and r.toggle_max_ms is not None:
        lines.append(f"kwarg toggle     median {r.toggle_median_ms:.2f} ms, max {r.toggle_max_ms:.1f} ms over "
                     f"{r.toggle_cells} cells ({', '.join(f'{m}: {k}' for m, k in r.toggle_kwargs.items())})")
    naive_rss = f"; the naive baseline's own process: {r.naive_peak_rss_mb:.1f} MiB" \
        if r.naive_peak_rss_mb is not None else ""
    lines.append(f"peak RSS         {r.peak_rss_mb:8.1f} MiB  (models loaded, matrices and toggles run{naive_rss})")
    if r.long_conversations:
        lc = r.long_conversations
        lines.append(f"long prompts     {lc['whole_s']:8.3f} s whole vs {lc['segmented_s']:.3f} s segment-cached "
                     f"({lc['speedup']:.2f} x; {lc['model']}, {lc['conversations']} fuzz conversations, "
                     f"{lc['strings']} strings, {lc['tokens']} tokens)")
    lines += long_session_text(r.long_session)
    lines += watch_text(r.watch)
    lines += [f"naive path {m}: {p}" for m, p in r.naive_paths.items()]
    lines += [f"segments {m}: {note}" for m, note in r.segment_reuse.items()]
    return "\n".join(lines)


def _incremental_text(stats: dict[str, Any] | None) -> str:
    if not stats:
        return ""
    if stats.get("refusal"):
        return f"; every render in full: {stats['refusal']}"
    return (f"; loop iterations replayed {stats['iterations_replayed']}, executed {stats['iterations_executed']}, "
            f"renders in full {stats['fell_back'] + stats['raised']} of {stats['renders'] + stats['raised']}")


def long_session_text(section: dict[str, Any]) -> list[str]:
    lines = []
    for p in section.get("points", []):
        if "error" in p:
            lines.append(f"long session     {p['model']}, {p['calls']} calls: {p['error']}")
            continue
        lines.append(f"long session     {p['wall_s']:8.3f} s  ({p['model']}, {p['calls']} calls, {p['requests']} "
                     f"requests, last prompt {p['last_prompt_tokens']} tokens; renders {p['render_s']:.3f} s, floor "
                     f"{p['floor_s']:.3f} s: {p['ratio_to_floor']:.1f} x the floor; renders replayed "
                     f"{p['simulator_s']:.3f} s, {p['simulator_ratio_to_floor']:.2f} x the floor; peak RSS "
                     f"{p['peak_rss_mb']:.0f} "
                     f"MiB, {p['rss_after_loading_mb']:.0f} after loading, {p['rss_with_report_mb']:.0f} with the "
                     f"report{_incremental_text(p.get('incremental_render'))})")
    for model_id, exponents in section.get("growth_exponent", {}).items():
        shown = ", ".join(f"{k} {v}" for k, v in exponents.items() if v is not None)
        lines.append(f"long session     {model_id} growth exponents: {shown}")
    return lines
