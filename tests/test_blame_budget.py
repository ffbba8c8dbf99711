"""Blame's budget: a template candidate the search skips without rendering it (engine.blame._acts_after) could not
have moved the break, rendered through the real template; an encoder whose trace does not count its output has none
skipped."""

from __future__ import annotations

import pytest

from engine import blame
from engine.models import load_model
from engine.simulate import rerender, run_cell_with
from tests.test_real_engines import need

# Raw-column cells of the default matrix whose cause is a template construct, across template families.
TEMPLATE_CELLS = [
    ("qwen3.5", "reasoning-whitespace"),
    ("qwen3.5", "next-user-turn"),
    ("gpt-oss", "tool-call"),
    ("kimi-k2.6", "newline-after-think"),
    ("glm-5.1", "next-user-turn"),
    ("deepseek-v3.2", "next-user-turn"),
    ("mistral-small-3.2", "next-user-turn"),
]


def _explained_with_skips(model_id: str, scenario: str, monkeypatch: pytest.MonkeyPatch):
    skipped = []
    decide = blame._acts_after

    def recording(change, runs, agreed, boundary):
        acts_after = decide(change, runs, agreed, boundary)
        if acts_after:
            skipped.append((change, boundary))
        return acts_after

    monkeypatch.setattr(blame, "_acts_after", recording)
    model = load_model(model_id)
    cell = run_cell_with(model, scenario, "raw", {}, hints=False)
    return model, cell, skipped


@pytest.mark.parametrize(("model_id", "scenario"), TEMPLATE_CELLS)
def test_a_skipped_candidate_rendered_breaks_where_the_next_prompt_does(model_id, scenario, monkeypatch):
    model, cell, skipped = _explained_with_skips(model_id, scenario, monkeypatch)
    assert cell.cause is not None and cell.cause.stage == "template", cell.cause
    assert skipped, "the search skipped no candidate"
    for change, boundary in skipped:
        again = rerender(model, change.base or boundary, change)
        assert again is None or again.string_prefix.common <= boundary.string_prefix.common, change


def test_an_encoder_whose_trace_does_not_count_its_output_has_every_candidate_rendered(monkeypatch):
    _, cell, skipped = _explained_with_skips("deepseek-v4", "args-serialization", monkeypatch)
    assert cell.cause is not None and cell.cause.stage == "template", cell.cause
    assert skipped == []


# Cells whose break follows a parse by a release's own code (vLLM 0.33.0's MiniMax and Llama tool parsers, SGLang
# 0.5.23's qwen3_coder): the parse at the break is traced for the cause's edits.
TRACED_BREAKS = [
    ("minimax-m2.7", "parallel-tool-calls", "vllm"),
    ("llama-3.1", "args-serialization", "vllm"),
    ("qwen3-coder", "args-serialization", "sglang"),
]


@pytest.mark.parametrize(("model_id", "scenario", "engine"), TRACED_BREAKS)
def test_the_traced_parse_at_a_break_is_asked_alone_and_gives_what_running_the_cell_again_gives(
        model_id, scenario, engine, monkeypatch):
    from engine import simulate

    need("vllm@0.33.0" if engine == "vllm" else "sglang@0.5.23")
    traced_runs: list[int] = []
    roundtrip = simulate._roundtrip

    def recording(*args, **kwargs):
        if kwargs.get("trace_at") is not None:
            traced_runs.append(kwargs["trace_at"])
        return roundtrip(*args, **kwargs)

    monkeypatch.setattr(simulate, "_roundtrip", recording)
    model = load_model(model_id)
    alone = run_cell_with(model, scenario, engine, {}, hints=False)
    assert traced_runs == []  # no run of the cell up to its break again
    broken = next(b for b in alone.boundaries if not b.holds)
    assert broken.parse.edits and {e.location.origin for e in broken.parse.edits} == {
        f"{'vllm 0.33.0' if engine == 'vllm' else 'sglang 0.5.23'} (real code)"}, broken.parse.edits[:3]

    traced_break = simulate._traced_break
    monkeypatch.setattr(simulate, "_traced_break", lambda *args: traced_break(*args[:10]))  # without the ask
    again = run_cell_with(model, scenario, engine, {}, hints=False)
    assert traced_runs == [broken.index]
    assert _shown(again) == _shown(alone)


def _shown(cell) -> tuple:
    from engine.matrix import cell_json

    return cell_json(cell), [(b.parse.to_json(), b.next_prompt.text, b.next_ids, b.layer_edits)
                             for b in cell.boundaries]
