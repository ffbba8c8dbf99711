"""What one click costs in the web app: the matrix page's script run, measured in one process with Streamlit's
AppTest (the same script run the server does on every widget change, without the browser's painting).

    python benchmarks/app_bench.py [--repeat 5] [--models a,b] [--json PATH|-]

Figures: the first view (every default model loaded, or the `--models` picked in the sidebar; every cell computed),
a re-run with nothing changed, a boolean template kwarg flipped (each model's in turn: the first flip recomputes that
model's cells while the others come from the cache; setting it back and flipping again find every cell cached, timed
apart), a matrix cell selected (the break view and the cause card), and the process's peak RSS with everything
loaded. A benchmark, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamlit.testing.v1 import AppTest  # noqa: E402

from engine.bench import machine_name, peak_rss_mb  # noqa: E402
from engine.models import default_model_ids, load_spec  # noqa: E402
from engine.scenario import scenario_ids  # noqa: E402


def quiet_no_context_warning() -> None:
    """AppTest's helper threads and widget setters run outside a script run and warn so; expected here."""
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)


def _timed_run(at: AppTest) -> float:
    start = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - start
    if at.exception:
        raise RuntimeError(f"the app raised: {[e.value for e in at.exception]}")
    return elapsed


def _cells_caption(at: AppTest) -> str:
    return next((c.value for c in at.caption if " cells in " in c.value), "")


def run(repeat: int, models: tuple[str, ...]) -> dict:
    if "DRIFT_WORKSPACE" in os.environ:
        return _run(repeat, models)
    # Uploads the page finds would add columns; an empty workspace of its own, removed afterwards.
    with tempfile.TemporaryDirectory(prefix="drift-app-bench-") as workspace:
        os.environ["DRIFT_WORKSPACE"] = workspace
        try:
            return _run(repeat, models)
        finally:
            del os.environ["DRIFT_WORKSPACE"]


def _app(models: tuple[str, ...], timeout_s: float) -> AppTest:
    """The app's script with `models` picked in the sidebar (all of the default ones: the page's own default)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout_s)
    if list(models) != default_model_ids():
        at.session_state["models"] = list(models)
    return at


def _run(repeat: int, models: tuple[str, ...]) -> dict:
    quiet_no_context_warning()
    at = _app(models, 600)
    load_before = os.getloadavg()
    first_view_s = _timed_run(at)
    quiet_no_context_warning()  # loading Streamlit's configuration in the first run resets its loggers' levels
    caption = _cells_caption(at)
    rerun_ms = [_timed_run(at) * 1000 for _ in range(repeat)]
    # The first flip of a model's kwarg recomputes that model's cells (the others come from the cell cache); setting
    # it back and flipping again find every cell cached.
    recompute_ms: dict[str, float] = {}
    cached_ms: list[float] = []
    for model_id in models:
        kwarg = next((k for k in load_spec(model_id).template_kwargs if isinstance(k.default, bool)), None)
        if kwarg is None:
            continue
        key = f"kw:{model_id}:{kwarg.name}"
        for cycle in range(repeat):
            for value in (not kwarg.default, kwarg.default):
                at.checkbox(key=key).set_value(value)
                elapsed = _timed_run(at) * 1000
                if cycle == 0 and value != kwarg.default:
                    recompute_ms[f"{model_id}: {kwarg.name}={str(value).lower()}"] = elapsed
                else:
                    cached_ms.append(elapsed)
    select_ms = []
    scenarios = scenario_ids()
    for model_id in models:
        at.session_state["matrix"] = {"selection": {"rows": [], "columns": [],
                                                    "cells": [(scenarios.index("next-user-turn"), model_id)]}}
        select_ms.append(_timed_run(at) * 1000)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine_name(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "repeat": repeat,
        "models": list(models),
        "first_view_s": round(first_view_s, 3),
        "first_view_caption": caption,
        "rerun_median_ms": round(statistics.median(rerun_ms), 1),
        "toggle_median_ms": round(statistics.median(recompute_ms.values()), 1),
        "toggle_max_ms": round(max(recompute_ms.values()), 1),
        "toggle_ms_by_kwarg": {k: round(v, 1) for k, v in recompute_ms.items()},
        "toggle_cached_median_ms": round(statistics.median(cached_ms), 1),
        "toggle_cached_runs": len(cached_ms),
        "select_cell_median_ms": round(statistics.median(select_ms), 1),
        "select_cell_max_ms": round(max(select_ms), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def pinned_first_view(spec: str, models: tuple[str, ...]) -> dict:
    """The first view of a fresh server (models loaded, no cell cached) showing the column of a pinned release, in
    this process: `engine@version` picked in the sidebar before the first script run."""
    quiet_no_context_warning()
    engine, _, version = spec.partition("@")
    at = _app(models, 900)
    at.session_state["engine_view"] = engine
    at.session_state[f"ver:{engine}"] = version
    seconds = _timed_run(at)
    return {"seconds": round(seconds, 3), "caption": _cells_caption(at)}


def pinned_views(specs: tuple[str, ...], models: tuple[str, ...]) -> dict:
    """Each pinned release's first view in a fresh process, with the persisted result cache as it is, then without it
    (DRIFT_RESULT_CACHE=0: every answer of the release asked of a fresh worker)."""
    import subprocess

    views: dict[str, dict] = {}
    for spec in specs:
        for label, env in (("with_cache", {}), ("without_cache", {"DRIFT_RESULT_CACHE": "0"})):
            done = subprocess.run([sys.executable, __file__, "--pinned", spec, "--models", ",".join(models)],
                                  capture_output=True, text=True, env={**os.environ, **env}, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the pinned view of {spec} failed: {done.stderr[-2000:]}")
            views[f"{spec} {label}"] = json.loads(done.stdout)
    return views


def report_text(r: dict) -> str:
    lines = [
        f"# drift-matrix app bench, {r['date']}, {r['machine']}; load average {r['load_average_before']} -> "
        f"{r['load_average_after']}",
        f"first view       {r['first_view_s']:8.3f} s  (the page says: {r['first_view_caption']})",
        f"re-run, no change  median {r['rerun_median_ms']:.1f} ms",
        f"kwarg toggle       median {r['toggle_median_ms']:.1f} ms, max {r['toggle_max_ms']:.1f} ms over "
        f"{len(r['toggle_ms_by_kwarg'])} models (the first flip: that model's cells recomputed, the rest cached)",
        f"  toggled again    median {r['toggle_cached_median_ms']:.1f} ms over {r['toggle_cached_runs']} script runs "
        "(every cell cached)",
        f"select a cell      median {r['select_cell_median_ms']:.1f} ms, max {r['select_cell_max_ms']:.1f} ms "
        "(break view and cause card)",
        f"peak RSS         {r['peak_rss_mb']:8.1f} MiB  ({len(r['models'])} models loaded, the app's caches filled)",
    ]
    lines += [f"  first flip {k}: {v:.1f} ms" for k, v in r["toggle_ms_by_kwarg"].items()]
    lines += [f"fresh server, {k}: {v['seconds']:.1f} s ({v['caption']})" for k, v in r.get("pinned", {}).items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="write the figures as JSON to PATH, or - for stdout")
    parser.add_argument("--models", help="a part of the default models, picked in the sidebar (default: all of them)")
    parser.add_argument("--pinned-releases", default="sglang@0.5.12,vllm@0.33.0",
                        help="releases whose column a fresh server shows first, each timed with and without the "
                             "result cache (comma-separated; 'none' skips)")
    parser.add_argument("--pinned", help=argparse.SUPPRESS)  # one fresh process's first view (pinned_views)
    args = parser.parse_args(argv)
    models = tuple(args.models.split(",")) if args.models else tuple(default_model_ids())
    unknown = [m for m in models if m not in default_model_ids()]
    if unknown:
        parser.error(f"--models takes default models ({', '.join(default_model_ids())}), got {', '.join(unknown)}")
    if args.pinned:
        with tempfile.TemporaryDirectory(prefix="drift-app-bench-") as workspace:
            os.environ["DRIFT_WORKSPACE"] = workspace
            print(json.dumps(pinned_first_view(args.pinned, models)))
        return 0
    report = run(args.repeat, models)
    if args.pinned_releases != "none":
        report["pinned"] = pinned_views(tuple(args.pinned_releases.split(",")), models)
    if args.json == "-":
        print(json.dumps(report, indent=2))
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(report_text(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
