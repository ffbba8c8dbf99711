"""Blame's budget: a template candidate the search skips without rendering it (engine.blame._acts_after) could not
have moved the break, rendered through the real template; an encoder whose trace does not count its output has none
skipped."""

from __future__ import annotations

import pytest

from engine import blame
from engine.models import load_model
from engine.simulate import rerender, run_cell_with

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
