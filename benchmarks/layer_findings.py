"""What each layer between the model and the cache breaks (issue 27), over the default models × scenarios.

    python benchmarks/layer_findings.py [--json out.json] [--layers raw@minijinja,...]

Runs the matrix once per layer (the column with the layer, its causes explained) and once for the same column
without it, and counts per layer: the statuses; the cells whose outcome the layer changes (status, or the boundary or
token where the first break is); the breaks blamed on the layer itself (a runtime construct, a proxy's rewrite, the
cache flag); for a runtime, the cells whose prompts are not transformers' (its note); one cause location per kind,
and the fix the cause card proves. Prints a Markdown table (docs/FINDINGS.md's "Layers" section) and the cause
locations.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.matrix import default_request  # noqa: E402
from engine.serving.spec import EngineSpec, split_names  # noqa: E402
from engine.simulate import run_cell  # noqa: E402

KEEP_REASONING = '{"clear_thinking":false,"preserve_thinking":true}'
# (the layered column, the column without the layer)
LAYERS = [
    ("raw@minijinja", "raw"), ("raw@hfjs", "raw"), ("vllm+minijinja", "vllm"), ("sglang+hfjs", "sglang"),
    ("vllm+litellm", "vllm"), ("vllm+litellm@1.104.9", "vllm"), ("raw+langchain-openai", "raw"),
    ("vllm+reasoning-field", "vllm"), ("sglang+reasoning-field", "sglang"),
    ("sglang[strip-thinking-cache]", "sglang"), (f"vllm[default-chat-template-kwargs={KEEP_REASONING}]", "vllm"),
]
LAYER_STAGES = ("runtime", "proxy", "cache")


def outcome(cell) -> tuple:
    focus = cell.focus
    if focus is None or cell.status not in ("holds", "breaks"):
        return (cell.status,)
    check = focus.token_prefix or focus.string_prefix
    return cell.status, focus.index, check.common if not check.holds else None


def measure(layered: str, base: str) -> dict:
    request = default_request()
    started = time.perf_counter()
    statuses: Counter = Counter()
    changed, blamed, prompts_differ = [], [], 0
    locations: dict[str, str] = {}
    fixes: Counter = Counter()
    for model in request.models:
        for scenario in request.scenarios:
            cell = run_cell(model, scenario, EngineSpec.parse(layered))
            plain = run_cell(model, scenario, base, explain=False)
            statuses[cell.status] += 1
            if outcome(cell) != outcome(plain):
                changed.append(f"{model} · {scenario}: {outcome(plain)[0]} -> {cell.status}")
            cause = cell.cause
            if cause is not None and cause.stage in LAYER_STAGES:
                blamed.append(f"{model} · {scenario}")
                locations.setdefault(f"{cause.stage}/{cause.kind}", f"{cause.location} ({model} · {scenario}): "
                                                                  f"{cause.location.text[:100]}")
                if cause.fix is not None:
                    fixes[cause.fix.text.split(":")[0]] += 1
            if cell.note and "prompt differs from transformers' Jinja" in cell.note:
                prompts_differ += 1
    return {"layer": layered, "without": base, "statuses": dict(statuses), "changed": changed,
            "blamed_on_layer": blamed, "prompts_differ": prompts_differ, "locations": locations,
            "fixes": dict(fixes), "seconds": round(time.perf_counter() - started, 1)}


def markdown(rows: list[dict]) -> str:
    out = ["| layer | holds / breaks / error / unavailable | outcome changed vs. without it | breaks blamed on the "
           "layer | prompts not transformers' |", "|---|---|---|---|---|"]
    for row in rows:
        s = row["statuses"]
        counts = " / ".join(str(s.get(k, 0)) for k in ("holds", "breaks", "error", "unavailable"))
        differ = str(row["prompts_differ"]) if EngineSpec.parse(row["layer"]).runtime else "—"
        out.append(f"| `{row['layer']}` (vs `{row['without']}`) | {counts} | {len(row['changed'])} | "
                   f"{len(row['blamed_on_layer'])} | {differ} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument("--layers", help="comma-separated layered columns (default: all of LAYERS)")
    args = parser.parse_args()
    wanted = [(a, b) for a, b in LAYERS if not args.layers or a in split_names(args.layers)]
    rows = []
    for layered, base in wanted:
        row = measure(layered, base)
        rows.append(row)
        print(f"{layered}: {row['statuses']} changed {len(row['changed'])} blamed {len(row['blamed_on_layer'])} "
              f"prompts {row['prompts_differ']} in {row['seconds']} s", file=sys.stderr, flush=True)
    print(markdown(rows))
    for row in rows:
        print(f"\n{row['layer']}: " + "; ".join(f"{k} at {v}" for k, v in row["locations"].items()))
        for line in row["changed"]:
            print(f"  {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
