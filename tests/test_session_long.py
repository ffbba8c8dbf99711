"""Long sessions give exactly the figures they gave before the simulator was made linear (issue 19).

tests/golden/sessions/long-session.json holds the JSON of `python -m engine session ... --json -` for long
generated sessions (engine.bench.long_session_script), taken with the quadratic implementation before the change:
every request's prompt / reusable / prefill / decode / block / hybrid figures, totals, break views (positions,
snippets, template lines) and the history-kept what-if. Regenerate only on purpose, and say why:
`python tests/test_session_long.py --regenerate`. Known on purpose: request 31 of "gpt-oss 30 calls, follow-up" decodes
-745 tokens (the sequence re-rendered after a final answer drops the analysis turns; issue 14 fixes that figure, and
the file is regenerated with that fix).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "sessions" / "long-session.json"

# name -> (calls, follow-up question, CLI arguments after --script FILE)
CASES: dict[str, tuple[int, bool, list[str]]] = {
    "qwen3.6 80 calls": (80, False, ["--model", "qwen3.6"]),
    "glm-5.1 60 calls": (60, False, ["--model", "glm-5.1"]),
    "gpt-oss 30 calls, follow-up": (30, True, ["--model", "gpt-oss"]),
    "deepseek-v4 30 calls, follow-up": (30, True, ["--model", "deepseek-v4"]),
    "qwen3.6 30 calls, follow-up": (30, True, ["--model", "qwen3.6"]),
    "qwen3.6 30 calls, follow-up, append-only": (30, True, ["--model", "qwen3.6", "--history", "append"]),
    "qwen3.6 12 calls through vllm": (12, False, ["--model", "qwen3.6", "--engine", "vllm"]),
    "glm-5.1 30 calls, follow-up, through sglang": (30, True, ["--model", "glm-5.1", "--engine", "sglang"]),
    "qwen3.6 30 calls, tool result summarised": (30, False, ["--model", "qwen3.6", "--what-if",
                                                             "tool-result-summarised"]),
}


def session_json(name: str, directory: Path) -> dict:
    """What `python -m engine session` writes for one case (run in this process through the CLI's main)."""
    from engine.bench import long_session_script
    from engine.cli import main

    calls, follow_up, arguments = CASES[name]
    script = directory / f"long-{calls}{'-follow-up' if follow_up else ''}.json"
    script.write_text(json.dumps(long_session_script(calls, follow_up)), encoding="utf-8")
    out = directory / "out.json"
    assert main(["session", "--script", str(script), *arguments, "--json", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_golden_covers_every_case(golden):
    assert sorted(golden) == sorted(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_long_session_figures_unchanged(name, golden, tmp_path):
    assert session_json(name, tmp_path) == golden[name]


def test_golden_sessions_break_where_expected(golden):
    # The follow-up question breaks the prefix for templates that drop earlier reasoning; the golden file pins
    # break views, not only counts (a file of sessions that never break would not test the break view).
    assert [b["request"] for b in golden["gpt-oss 30 calls, follow-up"]["breaks"]] == [32]
    assert all(len(golden[n]["requests"]) == CASES[n][0] + 1 + CASES[n][1] for n in CASES if "what-if" not in
               CASES[n][2])


if __name__ == "__main__" and sys.argv[1:] == ["--regenerate"]:
    import tempfile

    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        data = {name: session_json(name, Path(tmp)) for name in CASES}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}: {len(data)} sessions")
