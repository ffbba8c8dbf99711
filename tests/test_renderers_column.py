"""The `renderers` column: PrimeIntellect's renderers 0.1.12 from PyPI, driven as prime-rl (verifiers' TrainClient)
drives it, over our real tokenizers: bridge_to_next_turn, else a full render; every full render and every bridge
compared with the model's real template."""

from __future__ import annotations

import pytest

from engine.matrix import cell_json, default_request
from engine.models import load_model
from engine.renderers_column import TokenizerAdapter
from engine.simulate import ENGINES, run_cell


def test_the_column_is_in_the_default_matrix_and_names_its_release() -> None:
    assert "renderers" in ENGINES and "renderers" in default_request().engines
    cell = run_cell("qwen3.6", "tool-call", "renderers")
    data = cell_json(cell)
    assert (data["engine"], data["engine_version"], data["status"]) == ("renderers", "0.1.12", "holds")
    assert data["note"] == (
        "renderers 0.1.12 Qwen36Renderer as verifiers' TrainClient calls it; request 2 bridged (bridge_to_next_turn)")
    assert data["token_prefix"] == {"prev_len": 1055, "common": 1055, "holds": True}
    # Replayable by the name evidence writes (engine@version); another release is refused in one sentence.
    assert run_cell("qwen3.6", "tool-call", "renderers@0.1.12").status == "holds"
    assert run_cell("qwen3.6", "tool-call", "renderers@0.0.1").note == (
        "renderers 0.0.1 was asked for, but renderers 0.1.12 is the one installed (pinned in requirements.txt)")


@pytest.mark.parametrize("model_id", ["qwen3.6", "qwen3.5", "glm-5.1"])
def test_its_bridge_is_the_templates_append_only_bridge(model_id: str) -> None:
    # Two independent append-only bridges, the package's hand-written one and ours over the real template, give the
    # same ids wherever the package bridges, and the note says the template agrees.
    ours = run_cell(model_id, "tool-call-id", "bridge").boundaries
    theirs = run_cell(model_id, "tool-call-id", "renderers")
    assert theirs.note.endswith("request 2 bridged (bridge_to_next_turn); request 3 bridged (bridge_to_next_turn)")
    assert [b.next_ids for b in theirs.boundaries] == [b.next_ids for b in ours]


def test_a_new_user_turn_falls_back_to_a_full_render_and_breaks_where_the_template_drops_reasoning() -> None:
    cell = run_cell("qwen3.6", "next-user-turn", "renderers")
    assert cell.status == "breaks"
    assert cell.note == (
        "renderers 0.1.12 Qwen36Renderer as verifiers' TrainClient calls it; request 2 bridged (bridge_to_next_turn); "
        "request 3 fell back to a full render (bridge_to_next_turn returned None; its thinking_retention is "
        "'tool_cycle' and a user turn is new)")
    bridged, rendered = cell.boundaries
    assert bridged.holds
    assert rendered.token_prefix.to_json() == {"prev_len": 1099, "common": 1009, "holds": False}
    # The first differing token, as in every other cell: the model's <think> against the re-rendered <tool_call>.
    token = load_model("qwen3.6").tokenizer.token_text
    assert (token(rendered.prev_ids[1009]), token(rendered.next_ids[1009])) == ("<think>", "<tool_call>")
    # The raw column breaks at the same token: the port renders history as the template does.
    assert run_cell("qwen3.6", "next-user-turn", "raw").focus.token_prefix.common == 1009


def test_where_the_port_differs_from_the_template_the_cell_says_so() -> None:
    # GLM-5.1: an assistant turn with tool calls comes back with content None (verifiers keeps None beside calls),
    # and the port writes it as the text 'None'.
    glm = run_cell("glm-5.1", "next-user-turn", "renderers")
    assert glm.note.endswith("request 3: its render differs from the model's template (zai-org-GLM-5.1.jinja) at "
                             "token 865 of 902: 'None' where the template has '<tool_call>'")
    # GPT-OSS: harmony's generation prompt prefills the analysis channel, and its bridge names a tool result that
    # carries no `name` functions.unknown (the template names it after the call it answers).
    gpt = run_cell("gpt-oss", "tool-call", "renderers")
    assert gpt.status == "holds"
    assert gpt.note == (
        "renderers 0.1.12 GptOssRenderer as verifiers' TrainClient calls it; request 2 bridged (bridge_to_next_turn); "
        "request 1: its render differs from the model's template (openai-gpt-oss-120b.jinja) at token 823 of 823: "
        "'<|channel|>' where the template has the end; request 2: its bridge differs from what the model's template "
        "writes for the new messages at token 863 of 883: '.' where the template has '.get'")
    (boundary,) = gpt.boundaries
    assert boundary.prev_prompt.text.endswith("<|start|>assistant<|channel|>analysis<|message|>")
    assert "<|start|>functions.unknown to=assistant" in boundary.next_prompt.text[len(boundary.prev_text):]


def test_models_it_does_not_serve_here_are_unavailable_with_one_sentence() -> None:
    v4 = run_cell("deepseek-v4", "tool-call", "renderers")
    assert (v4.status, v4.note) == ("unavailable", (
        "renderers 0.1.12 has no renderer for deepseek-ai/DeepSeek-V4-Pro (its MODEL_RENDERER_MAP names models "
        "exactly), so prime-rl's auto config would fall back to DefaultRenderer, which renders through the Hub "
        "tokenizer's Jinja chat template and DeepSeek V4 ships none"))
    kimi = run_cell("kimi-k2.6", "tool-call", "renderers")
    if load_model("kimi-k2.6").tokenizer is None:  # tiktoken.model is no package's file; a user may supply it
        assert (kimi.status, kimi.note) == ("unavailable", (
            "renderers needs a tokenizer object, and tiktoken.model of moonshotai/Kimi-K2.6 is not shipped by any "
            "package here (put it in $DRIFT_ASSETS_DIR/kimi-k2.6/ or upload it)"))
    else:
        assert kimi.status in ("holds", "breaks") and kimi.note.startswith("renderers 0.1.12 KimiK25Renderer")


def test_the_tokenizer_adapter_gives_our_tokenizers_ids() -> None:
    model = load_model("glm-5.1")
    adapter = TokenizerAdapter(model.tokenizer, model.spec.hub_repo, "<|endoftext|>")
    text = "<|user|>Hello, world<|assistant|><think>"
    assert adapter.encode(text, add_special_tokens=False) == list(model.tokenizer.encode(text).ids)
    assert adapter.decode(adapter.encode(text)) == text
    assert adapter.convert_tokens_to_ids(["<|user|>", "<think>"]) == [model.tokenizer.token_id("<|user|>"),
                                                                      model.tokenizer.token_id("<think>")]
    assert adapter.eos_token_id == model.tokenizer.token_id("<|endoftext|>")
    assert adapter.convert_tokens_to_ids("not one token at all") is None
