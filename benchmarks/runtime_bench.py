"""What a template runtime costs per render, and how the cost grows with the templates and with a session's length.

    python benchmarks/runtime_bench.py [--repeat 5]

Renders the same requests with transformers' Jinja (JinjaRenderer's full render, and its incremental render that
resumes the template's loops over a grown history), MiniJinja (in process) and @huggingface/jinja (one Node
process; a render is a JSON line each way). Per template: the tool-call scenario's last request of each Jinja model.
Per session length: Qwen3.6's template over a history of N messages (the tool-call request's turns repeated), each
length rendered after the one before (a growing session). Medians in milliseconds, and each runtime's ratio to
transformers' full render measured in the same run (ratios, not absolute times, are what carries over to another
machine or load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.models import default_model_ids, load_model  # noqa: E402
from engine.render.runtimes import RenderFailure, runtime  # noqa: E402
from engine.simulate import run_cell  # noqa: E402

LENGTHS = (8, 32, 128, 512)


def _median_ms(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _request(model_id: str):
    cell = run_cell(model_id, "tool-call", "raw", explain=False)
    return cell.boundaries[-1].next_request if cell.boundaries else None


def _figures(inner, context: dict, repeat: int) -> dict[str, float]:
    """One request's medians: transformers' full render, then each runtime's (compiled once first, as a column
    does); a runtime that refuses the template has no figure."""
    source = inner.template_source
    figures = {"transformers": _median_ms(lambda: inner._text_template.render(**context), repeat)}
    for name in ("minijinja", "hfjs"):
        engine = runtime(name)
        if isinstance(engine.render_many(source, [context])[0], RenderFailure):
            continue
        figures[name] = _median_ms(lambda engine=engine: engine.render_many(source, [context]), repeat)
    return figures


def per_template(repeat: int) -> list[tuple[str, int, dict[str, float]]]:
    rows = []
    for model_id in default_model_ids():
        model = load_model(model_id)
        inner = getattr(model.renderer, "inner", model.renderer)
        request = _request(model_id)
        if request is None or not hasattr(inner, "template_source"):
            continue
        chat, variables = inner.template_context(request.messages, request.tools, True, request.kwargs)
        rows.append((model_id, len(chat), _figures(inner, {"messages": chat, **variables}, repeat)))
    return rows


def per_length(repeat: int) -> list[tuple[int, dict[str, float]]]:
    model = load_model("qwen3.6")
    inner = getattr(model.renderer, "inner", model.renderer)
    request = _request("qwen3.6")
    head = request.messages[:1]  # the system prompt
    turns = request.messages[1:]
    rows = []
    for length in LENGTHS:
        history = head + [dict(turns[i % len(turns)]) for i in range(length)]
        while history[-1]["role"] == "assistant":  # a request ends with the user's or a tool's turn
            history.pop()
        chat, variables = inner.template_context(history, request.tools, True, request.kwargs)
        figures = _figures(inner, {"messages": chat, **variables}, repeat)
        figures["transformers incremental"] = _median_ms(
            lambda history=history: inner.render(history, request.tools, add_generation_prompt=True,
                                                 kwargs=request.kwargs), repeat)
        rows.append((len(chat), figures))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    names = ("transformers", "minijinja", "hfjs")
    print("| template (tool-call request) | messages | transformers ms | MiniJinja ms (×) | "
          "@huggingface/jinja ms (×) |")
    print("|---|---|---|---|---|")
    for model_id, messages, figures in per_template(args.repeat):
        base = figures["transformers"]
        cells = [f"{figures[n]:.2f}" + (f" ({figures[n] / base:.1f}×)" if n != "transformers" else "")
                 if n in figures else "refused" for n in names]
        print(f"| {model_id} | {messages} | " + " | ".join(cells) + " |")
    print()
    print("| messages (Qwen3.6) | transformers full ms | transformers incremental ms | MiniJinja ms (×) | "
          "@huggingface/jinja ms (×) |")
    print("|---|---|---|---|---|")
    for messages, figures in per_length(args.repeat):
        base = figures["transformers"]
        print(f"| {messages} | {base:.2f} | {figures['transformers incremental']:.2f} | "
              f"{figures['minijinja']:.2f} ({figures['minijinja'] / base:.1f}×) | "
              f"{figures['hfjs']:.2f} ({figures['hfjs'] / base:.1f}×) |")


if __name__ == "__main__":
    main()
