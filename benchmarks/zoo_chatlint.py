"""Where the zoo scan's verdict and chatlint's disagree, for the same template and the same conversation shape.

    python benchmarks/zoo_chatlint.py [--cache DIR] [--examples 3] [--json PATH]

chatlint 0.1.2's `prefix_stability` renders successive snapshots of a conversation (each with a generation prompt,
no completion, no kwargs) and asks whether snapshot k is a string prefix of snapshot k+1; the zoo asks whether
prompt k + the model's completion is a prefix of prompt k+1 (string and, where the tokenizer is verified, tokens).
Two pairs have the same messages on both sides, so their first transition is the same request boundary:

| ours (scenario, boundary 1) | chatlint (shape, snapshot 0 -> 1) |
|---|---|
| tool-call: user, assistant reasoning + one tool call, tool result | think_then_tool |
| no-tools-next-user: user, assistant reasoning + answer, user | think_then_answer |

For every template the zoo scanned (read from its cache, `python -m engine zoo` fills it), both verdicts, counted by
(ours, chatlint's), with examples of each disagreement.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chatlint.properties import _common_prefix, _generation_prompt, classify_divergence  # noqa: E402
from chatlint.render import Template  # noqa: E402
from chatlint.rendering import Rendering  # noqa: E402
from chatlint.shapes import all_shapes  # noqa: E402

from engine.zoo import SCANNED, ZooCache, cached_results, zoo_template  # noqa: E402

PAIRS = (("tool-call", "think_then_tool"), ("no-tools-next-user", "think_then_answer"))


def first_transition(template: Template, shape) -> str:
    """chatlint's verdict on snapshot 0 -> 1 alone, with its own harness and classification."""
    prompts, error = Rendering(template, shape).sequence()
    if error or len(prompts) < 2:
        return "skip (did not render)"
    previous, following = prompts[0], prompts[1]
    if following.startswith(previous):
        return "pass"
    common = _common_prefix(previous, following)
    kind = classify_divergence(previous[common:], _generation_prompt(template, shape, 0), common, len(previous))
    return f"fail ({kind})"


def _relation(ours: str, theirs: str) -> str:
    if ours == "refused":
        return "we refuse"
    if theirs.startswith("skip"):
        return "chatlint cannot render"
    return "agree" if (ours == "holds") == (theirs == "pass") else "DISAGREE"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="the zoo cache (default: $DRIFT_ZOO_CACHE or ~/.cache/drift-matrix/zoo)")
    parser.add_argument("--examples", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    results, missing = cached_results(ZooCache(args.cache))
    if missing:
        print(f"note: {len(missing)} templates have no cached scan; run `python -m engine zoo` first for all",
              file=sys.stderr)
    shapes = {s.name: s for s in all_shapes()}
    counts: dict[str, Counter] = {scenario: Counter() for scenario, _ in PAIRS}
    examples: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for result in results:
        if result.outcome != SCANNED:
            continue
        template = zoo_template(result.template)
        source = Template(template.name, template.path.read_text(encoding="utf-8"))
        cells = {c.scenario: c for c in result.cells}
        for scenario, shape in PAIRS:
            cell = cells[scenario]
            ours = cell.status + (f" ({cell.cause})" if cell.cause else "")
            theirs = first_transition(source, shapes[shape])
            counts[scenario][(cell.status, theirs)] += 1
            examples[(scenario, cell.status, theirs)].append(f"{result.template}: {ours}")
    report = {scenario: [{"ours": o, "chatlint": t, "templates": n,
                          "examples": examples[(scenario, o, t)][: args.examples]}
                         for (o, t), n in sorted(counts[scenario].items())] for scenario in counts}
    for (scenario, shape) in PAIRS:
        print(f"## {scenario} (ours, boundary 1) vs {shape} (chatlint, snapshot 0 -> 1)")
        for row in report[scenario]:
            print(f"{row['templates']:>4}  ours {row['ours']:<8} chatlint {row['chatlint']:<26} "
                  f"{_relation(row['ours'], row['chatlint'])}  e.g. {'; '.join(row['examples'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
