"""`python -m engine bench`: what the drift matrix costs, measured in one run on the same inputs.

Figures: cold start (every default model's template and tokenizer loaded fresh), the full default matrix with
every cache emptied first, the median cell, the floor (the distinct strings the matrix tokenizes, each tokenized
whole by the tokenizer library, nothing cached), the same distinct requests rendered once, peak RSS, a cell
recomputed after a kwarg toggle with the caches warm (the web app's click), and a naive baseline: transformers'
`apply_chat_template(..., tokenize=True)` on every request, nothing cached. A benchmark, not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import copy
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.matrix import MatrixRequest, default_request, run_matrix
from engine.models import LoadedModel, load_model, load_spec, special_token_vars
from engine.simulate import run_cell, run_cell_with
from engine.tokenize import clear_loaded_tokenizers, token_ids


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
    # The full default matrix, every cache (cells, renders, strings, segments) emptied before each run; best run.
    cells: int
    matrix_s: float
    matrix_runs_s: list[float]
    cell_median_ms: float
    cell_max_ms: float
    # The floor: each distinct string the matrix tokenizes, tokenized whole by the library; best pass.
    distinct_strings: int
    tokens: int
    characters: int
    floor_s: float
    floor_project_s: float  # the same strings through the project's whole-string encode (ids + char offsets)
    ratio_to_floor: float | None
    # Rendering: each distinct request the matrix renders, rendered once (text only, as the matrix renders first,
    # uncached); best pass. Then the same with the per-character provenance read (the recording render too), and
    # how many of the matrix's distinct renders had their provenance read (the bridge, and blame at a break).
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
    # The web app's click: one cell recomputed with a boolean kwarg flipped, caches warm from the matrix.
    toggle_cells: int
    toggle_median_ms: float | None  # None when no model has a boolean kwarg
    toggle_max_ms: float | None
    toggle_kwargs: dict[str, str]
    # Memory: high-water RSS with all default models loaded and the matrix run; then after the naive baseline.
    peak_rss_mb: float
    peak_rss_with_naive_mb: float
    segment_reuse: dict[str, str]
    cache_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    # Where tokenization does dominate: the prompts of long random conversations (engine.fuzz), each string
    # tokenized whole by the library vs by the segment cache starting empty.
    long_conversations: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RenderRequest:
    messages: list[dict]
    tools: list[dict] | None
    add_generation_prompt: bool
    kwargs: dict | None


def peak_rss_mb() -> float:
    """High-water resident set size of this process (VmHWM), in MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

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
    """Empty every cache the matrix fills: cells, renders, whole strings and segments."""
    from engine import simulate

    simulate._cached_cell.cache_clear()
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

    def __enter__(self) -> _Recorder:
        for model_id in self.model_ids:
            model = load_model(model_id)
            renderer = model.renderer
            original_render = renderer.render
            requests = self.requests[model_id]

            def render(messages, tools, *, add_generation_prompt, kwargs=None, _render=original_render,
                       _requests=requests):
                # Deep copies: the simulator keeps appending to the history list it rendered.
                _requests.append(RenderRequest(copy.deepcopy(messages), copy.deepcopy(tools), add_generation_prompt,
                                               copy.deepcopy(kwargs)))
                return _render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)

            renderer.render = render  # instance attribute, removed on exit
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
        for model_id in self.model_ids:
            model = load_model(model_id)
            model.renderer.__dict__.pop("render", None)
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


def _best(passes: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


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


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run_bench(request: MatrixRequest | None = None, *, repeat: int = 3, naive: bool = True,
              progress: Callable[[str], None] = _progress) -> BenchReport:
    request = request or default_request()
    models = request.models
    load_before = os.getloadavg()
    progress("cold start")
    cold_s, cold_models, fresh_imports = cold_start(models)

    progress("recording the strings and requests of one matrix run")
    clear_run_caches(models)
    with _Recorder(models) as recorder:
        cells = run_matrix(request)
    stats = {}
    for model_id in models:
        tokenizer = load_model(model_id).tokenizer
        if tokenizer is not None and hasattr(tokenizer, "cache_stats"):
            stats[model_id] = tokenizer.cache_stats()

    provenance_read = sum(_provenance_read(load_model(m).renderer) for m in models)

    progress(f"matrix x{repeat}")
    runs = []
    for _ in range(repeat):
        clear_run_caches(models)
        start = time.perf_counter()
        run_matrix(request)
        runs.append(time.perf_counter() - start)
    clear_run_caches(models)
    cell_times = []
    for model_id in models:
        for scenario in request.scenarios:
            for engine in request.engines:
                start = time.perf_counter()
                run_cell(model_id, scenario, engine, request.kwargs.get(model_id, {}))
                cell_times.append(time.perf_counter() - start)
    matrix_s = min(runs)

    progress("floor: distinct strings tokenized whole")
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

    floor_s = _best(repeat, floor_pass)
    floor_project_s = _best(repeat, project_pass)
    tokens = sum(len(load_model(m).tokenizer.encode_ids(t)) for m in encoders for t in strings[m])
    characters = sum(len(t) for m in encoders for t in strings[m])

    progress("rendering: distinct requests once each")
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

    render_s = _best(repeat, render_pass)

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

    render_with_provenance_s = _best(repeat, render_with_provenance_pass)

    progress("kwarg toggles (caches warm)")
    clear_run_caches(models)
    run_matrix(request)
    toggle_times, toggled = _toggles(request)
    rss = peak_rss_mb()

    naive_s: float | None = None
    naive_cells_s: float | None = None
    paths: dict[str, tuple[str, Callable]] = {}
    differ = 0
    cell_requests: dict[str, list[RenderRequest]] = {m: [] for m in models}
    if naive:
        progress("naive baseline: building transformers tokenizers")
        paths = {m: naive_path(load_model(m)) for m in models}
        cell_requests = _cell_requests(request)
        progress("naive baseline: every request")
        naive_s = _naive(models, recorder.requests, paths)
        naive_cells_s = _naive(models, cell_requests, paths)
        for model_id in models:
            model = load_model(model_id)
            for r in distinct[model_id]:
                try:
                    differ += paths[model_id][1](r) != _ours(model, r)
                except Exception:  # noqa: BLE001 - refused by both
                    pass

    segment_reuse = {m: getattr(load_model(m).tokenizer, "segment_note", "no tokenizer") for m in models}
    long_model = next((m for m in models if load_model(m).tokenizer is not None), None)
    progress("long conversations: whole-string vs segment-cached tokenization")
    long_conversations = long_conversation_tokenization(long_model, repeat=repeat) if long_model else {}
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
        matrix_runs_s=[round(t, 4) for t in runs],
        cell_median_ms=round(statistics.median(cell_times) * 1000, 3),
        cell_max_ms=round(max(cell_times) * 1000, 3),
        distinct_strings=sum(len(v) for v in strings.values()),
        tokens=tokens,
        characters=characters,
        floor_s=round(floor_s, 4),
        floor_project_s=round(floor_project_s, 4),
        ratio_to_floor=round(matrix_s / floor_s, 2) if floor_s else None,
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
        naive_paths={m: p[0] for m, p in paths.items()},
        naive_ids_differ=differ,
        toggle_cells=len(toggle_times),
        toggle_median_ms=round(statistics.median(toggle_times) * 1000, 3) if toggle_times else None,
        toggle_max_ms=round(max(toggle_times) * 1000, 3) if toggle_times else None,
        toggle_kwargs=toggled,
        peak_rss_mb=round(rss, 1),
        peak_rss_with_naive_mb=round(peak_rss_mb(), 1),
        segment_reuse=segment_reuse,
        cache_stats=stats,
        long_conversations=long_conversations,
    )


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
        lines.append(f"matrix / floor   {r.ratio_to_floor:8.2f} x")
    lines += [
        f"render once      {r.render_s:8.3f} s  ({r.distinct_renders} distinct of {r.render_calls} render calls; "
        f"with provenance {r.render_with_provenance_s:.3f} s, read by the matrix for {r.provenance_read})",
        f"matrix / (render once + floor) {r.ratio_to_render_and_floor:.2f} x",
    ]
    if r.naive_s is not None and r.naive_cells_s is not None and r.speedup_vs_naive is not None:
        lines += [
            f"naive            {r.naive_s:8.3f} s  ({r.naive_requests} requests; cells only: {r.naive_cells_s:.3f} s "
            f"for {r.naive_cell_requests}); ids differing from the matrix: {r.naive_ids_differ}",
            f"naive / matrix   {r.speedup_vs_naive:8.2f} x",
        ]
    else:
        lines.append("naive            skipped (--no-naive)")
    if r.toggle_median_ms is not None and r.toggle_max_ms is not None:
        lines.append(f"kwarg toggle     median {r.toggle_median_ms:.2f} ms, max {r.toggle_max_ms:.1f} ms over "
                     f"{r.toggle_cells} cells ({', '.join(f'{m}: {k}' for m, k in r.toggle_kwargs.items())})")
    lines.append(f"peak RSS         {r.peak_rss_mb:8.1f} MiB  (after the naive baseline too: "
                 f"{r.peak_rss_with_naive_mb:.1f} MiB)")
    if r.long_conversations:
        lc = r.long_conversations
        lines.append(f"long prompts     {lc['whole_s']:8.3f} s whole vs {lc['segmented_s']:.3f} s segment-cached "
                     f"({lc['speedup']:.2f} x; {lc['model']}, {lc['conversations']} fuzz conversations, "
                     f"{lc['strings']} strings, {lc['tokens']} tokens)")
    lines += [f"naive path {m}: {p}" for m, p in r.naive_paths.items()]
    lines += [f"segments {m}: {note}" for m, note in r.segment_reuse.items()]
    return "\n".join(lines)
