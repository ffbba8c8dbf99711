"""The store of proved causes (engine/cause_store.py): lossless, used only for a cell that breaks exactly as it broke,
and searched again when anything the key covers changes."""

from __future__ import annotations

import json

import pytest

from engine import blame
from engine.cause_store import cause_from_json, cause_key, cause_to_json
from engine.models import load_model
from engine.serving.real.results import pack_entries, result_cache
from engine.simulate import run_cell_with

# One cell of each stage the default matrix blames: client, parser (with the engine's edit), template, tokenizer, and
# a proxy layer's (its request-side edit).
CELLS = [("qwen3.6", "client-drops-reasoning", "raw"), ("qwen3.6", "args-serialization", "vllm"),
         ("qwen3.6", "content-truncated", "raw"), ("qwen3.6", "noncanonical-tokens", "raw"),
         ("qwen3.6", "tool-call", "raw+langchain-openai")]


@pytest.mark.parametrize(("model_id", "scenario", "engine"), CELLS)
def test_a_cause_comes_back_from_its_json_equal_field_for_field(model_id: str, scenario: str, engine: str) -> None:
    cause = run_cell_with(load_model(model_id), scenario, engine, {}).cause
    assert cause is not None
    assert cause_from_json(json.loads(json.dumps(cause_to_json(cause)))) == cause


def test_a_stored_cause_is_read_back_for_the_same_break_and_searched_again_when_an_input_changes(
        monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DRIFT_CAUSE_STORE", "1")
    monkeypatch.setenv("DRIFT_RESULT_CACHE_DIR", str(tmp_path))  # an empty store
    model = load_model("qwen3.6")
    first = run_cell_with(model, "content-truncated", "raw", {})
    assert first.status == "breaks" and first.cause is not None
    assert len([entry for folder in (tmp_path / "causes").iterdir() for entry in pack_entries(folder)]) == 1
    answered = result_cache().hits

    def no_search(*args, **kwargs):
        raise AssertionError("the cause was searched for again")

    monkeypatch.setattr(blame, "explain_break", no_search)
    again = run_cell_with(model, "content-truncated", "raw", {})
    assert again.cause == first.cause and again.boundaries == first.boundaries
    assert result_cache().hits > answered
    # Another kwarg, even one the template ignores (same prompts): another key, so the search runs again
    with pytest.raises(AssertionError, match="searched for again"):
        run_cell_with(model, "content-truncated", "raw", {"a_kwarg_the_template_ignores": True})


def test_no_key_when_the_store_is_off(monkeypatch) -> None:
    cell = run_cell_with(load_model("qwen3.6"), "content-truncated", "raw", {})
    from engine.scenario import load_scenario
    from engine.serving.spec import EngineSpec

    args = (load_model("qwen3.6"), load_scenario("content-truncated"), EngineSpec.parse("raw"), {}, cell.kwargs, True,
            cell.boundaries)
    monkeypatch.setenv("DRIFT_CAUSE_STORE", "1")
    assert cause_key(*args) is not None
    monkeypatch.setenv("DRIFT_CAUSE_STORE", "0")
    assert cause_key(*args) is None
    monkeypatch.setenv("DRIFT_CAUSE_STORE", "1")
    monkeypatch.setenv("DRIFT_RESULT_CACHE", "0")
    assert cause_key(*args) is None
