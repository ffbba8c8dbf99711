"""The default matrix's pinned engine columns (vllm = vllm@0.33.0, sglang = sglang@0.5.23, sglang@0.5.12) for a model
whose parser pair their emulations do not cover: the same release's real code parses it (never another release), and
a release that lacks the parser makes the cell unavailable with one sentence. Needs the engine cache or PyPI."""

from __future__ import annotations

import pytest
from test_real_engines import need

from engine.matrix import parser_pairs
from engine.models import load_model
from engine.scenario import load_scenario
from engine.serving import registry
from engine.serving.real.backend import RealEngine
from engine.serving.registry import for_parsers, get_engine
from engine.simulate import run_cell

CALL = ("get_weather", '{"city": "Paris"}')


def test_an_emulated_pair_stays_emulated_and_any_other_goes_to_the_same_release() -> None:
    need("vllm@0.33.0", "sglang@0.5.23")
    vllm, sglang = get_engine("vllm"), get_engine("sglang@0.5.23")
    assert for_parsers(vllm, "qwen3", "qwen3_coder") is vllm and for_parsers(sglang, "glm45", "glm47") is sglang
    # hermes has no emulation, nor vLLM's GLM (deleted: the release's code serves it); qwen3_coder has one, but only
    # checked with a reasoning parser beside it (Qwen3-Coder is served without one).
    for engine, pair in ((vllm, (None, "hermes")), (vllm, (None, "qwen3_coder")), (vllm, ("glm45", "glm47")),
                         (sglang, ("qwen3", "qwen25"))):
        routed = for_parsers(engine, *pair)
        assert isinstance(routed, RealEngine) and routed.spec == engine.spec
    paired = get_engine("vllm@0.33.0/qwen3+hermes")
    assert isinstance(paired, RealEngine) and paired.spec == "vllm@0.33.0"
    assert paired.parser_override == {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}


@pytest.mark.parametrize(("models", "columns", "started"), [
    # the default columns for Qwen3.5: both pinned emulations serve its pair; a fix hint re-runs a break on
    # sglang@0.5.12, which has no emulation
    (("qwen3.5",), ("vllm", "sglang", "raw", "bridge", "renderers"), [("sglang", "0.5.12")]),
    # GLM-5.1's pair runs vLLM 0.33.0's own code; SGLang 0.5.23's emulation hands DeepSeek V4 to deepseek-recipe
    (("qwen3.5", "glm-5.1"), ("vllm",), [("vllm", "0.33.0")]),
    (("deepseek-v4",), ("sglang",), [("sglang", "0.5.23"), ("sglang", "0.5.12")]),
    # a server flag runs in the release's own code, whatever the model
    (("qwen3.5",), ("sglang@0.5.23[strip-thinking-cache]",), [("sglang", "0.5.23"), ("sglang", "0.5.12")]),
    (("qwen3.5",), ("raw", "bridge", "no-such-engine"), []),
])
def test_a_matrix_starts_ahead_only_the_workers_its_cells_ask(monkeypatch: pytest.MonkeyPatch, models: tuple,
                                                             columns: tuple, started: list) -> None:
    """engine.matrix.run_matrix starts a release's worker before the first cell (spawn_releases) only where a column
    runs that release's own code for one of the matrix's models: a worker started for none cost a cold run of Qwen3.5
    alone two imports of about a second each."""
    asked: list[list] = []
    monkeypatch.setattr(registry, "spawn_workers", lambda releases: asked.append(list(releases)) or [])
    registry.spawn_releases(columns, parser_pairs(models))
    assert asked == [started]


def test_an_explicit_release_is_started_ahead_and_its_emulated_sibling_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    need("vllm@0.31.0")
    asked: list[list] = []
    monkeypatch.setattr(registry, "spawn_workers", lambda releases: asked.append(list(releases)) or [])
    registry.spawn_releases(("vllm@0.31.0", "raw"), parser_pairs(("qwen3.5",)))
    assert asked == [[("vllm", "0.31.0")]]


# (model, column, the parse the column's cell got for the tool call): content as the release returns it.
COLUMNS = [
    ("qwen2.5", "vllm", "vllm@0.33.0", None),
    ("qwen2.5", "sglang", "sglang@0.5.23", ""),
    ("qwen3-2507", "sglang@0.5.12", "sglang@0.5.12", None),
    ("qwen3-coder", "sglang@0.5.12", "sglang@0.5.12", None),
    ("deepseek-v3.1", "vllm", "vllm@0.33.0", None),  # deepseek_v31: no emulation
    ("deepseek-v3.1", "sglang", "sglang@0.5.23", ""),
]


@pytest.mark.parametrize(("model_id", "column", "release", "content"), COLUMNS)
def test_the_column_runs_its_own_releases_real_code(model_id: str, column: str, release: str,
                                                     content: str | None) -> None:
    need(release)
    cell = run_cell(model_id, "tool-call", column)
    assert (cell.status, f"{cell.engine}@{cell.engine_version}") == ("holds", release)
    boundary = cell.boundaries[0]
    parsed = boundary.parse
    assert (parsed.reasoning, parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls]) == \
        (None, content, [CALL])
    # The same text through the release's real code directly gives the same message.
    model, parsers = load_model(model_id), load_model(model_id).spec.engine_parsers[cell.engine]
    real = get_engine(f"real:{release}")
    text = real.output_text(boundary.completion.text, boundary.completion.stop_token, parsers["tool_call_parser"])
    direct = real.parse(text, reasoning_parser=parsers.get("reasoning_parser"),
                        tool_parser=parsers["tool_call_parser"], tools=load_scenario("tool-call").tools,
                        chat_template_kwargs=cell.kwargs, tokenizer=model.tokenizer, force_reasoning=False)
    assert (direct.reasoning, direct.content, [(c.name, c.arguments) for c in direct.tool_calls]) == \
        (None, content, [CALL])


@pytest.mark.parametrize(("model_id", "column", "sentence"), [
    ("glm-4.7-flash", "vllm@0.13.0", "vllm@0.13.0: unknown tool parser 'glm47'; known: deepseek_v3, "),
    ("glm-4.7-flash", "sglang@0.5.1", "sglang@0.5.1: unknown tool parser 'glm47'; known: deepseekv3, glm45, "),
    ("deepseek-v3.1", "sglang@0.5.1", "sglang@0.5.1: unknown tool parser 'deepseekv31'; known: deepseekv3, "),
    ("deepseek-v3.1", "vllm@0.10.0", "vllm@0.10.0: unknown reasoning parser 'deepseek_v3'; known: deepseek_r1, "),
])
def test_a_release_without_the_parser_is_unavailable_in_one_sentence(model_id: str, column: str,
                                                                      sentence: str) -> None:
    need(column)
    cell = run_cell(model_id, "tool-call", column)
    assert cell.status == "unavailable" and cell.note.startswith(sentence)
    assert cell.note.count(". ") == 0 and cell.boundaries == ()
