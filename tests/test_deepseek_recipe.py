"""DeepSeek V4 on SGLang 0.5.23: the prompt and the parse come from that release's own code and deepseek-recipe
(engine/render/deepseek_recipe.py, engine/serving/emulated/sglang_0_5_23/deepseek_recipe.py). Needs the engine cache or
PyPI; in CI these tests always run."""

from __future__ import annotations

import pytest
from conftest import require_release

from engine.errors import RenderError

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "hmm", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


@pytest.fixture(scope="module")
def model():
    require_release("sglang@0.5.23")
    from engine.models import load_model

    return load_model("deepseek-v4")


@pytest.fixture(scope="module")
def recipe(model):
    from engine.render.deepseek_recipe import SglangDeepSeekRecipeRenderer

    return SglangDeepSeekRecipeRenderer(model.tokenizer)


def encoder(model, kwargs: dict):
    """The model's own renderer: DeepSeek's encoding_dsv4.py (engine/render/deepseek_v4.py)."""
    return model.renderer.render(MESSAGES, TOOLS, add_generation_prompt=True, kwargs=kwargs)


def test_chat_mode_is_the_encoders_prompt(model, recipe):
    # SGLang reads `thinking` from the request and is off without it (SGLANG_DEFAULT_THINKING): chat mode, where
    # deepseek-recipe and DeepSeek's encoding_dsv4.py write the same prompt, earlier reasoning dropped
    for kwargs in (None, {"thinking": False}):
        rendered = recipe.render(MESSAGES, TOOLS, kwargs=kwargs)
        assert rendered.text == encoder(model, {"thinking": False}).text
        assert rendered.text.endswith("<｜User｜><tool_result>sunny</tool_result><｜Assistant｜></think>")
        assert "hmm" not in rendered.text


def test_thinking_asks_for_maximum_effort(model, recipe):
    # no effort given: SGLang 0.5.23's recipe path writes the maximum-effort preamble, which the encoder (vLLM's
    # default, "high") writes only for reasoning_effort="max"
    rendered = recipe.render(MESSAGES, TOOLS, kwargs={"thinking": True})
    assert rendered.text.startswith("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts "
                                    "permitted.\n")
    assert rendered.text == encoder(model, {"thinking": True, "reasoning_effort": "max"}).text
    assert rendered.text != encoder(model, {"thinking": True}).text
    start = rendered.text.index("Weather in Paris?")
    assert set(rendered.message_index[start:start + 17]) == {0} and rendered.message_index[start - 1] == -1
    assert rendered.origin == "sglang 0.5.23 deepseek-recipe (real code)"


def test_a_request_the_server_refuses_is_one_sentence(recipe):
    twice = [MESSAGES[0], {**MESSAGES[1], "tool_calls": [CALL, CALL]}, MESSAGES[2], MESSAGES[2]]
    with pytest.raises(RenderError) as info:
        recipe.render(twice, TOOLS)
    assert str(info.value) == ("deepseek-v4: sglang 0.5.23 refuses the request: Duplicate value for 'tool_call_id' of "
                               "c1 in message[1]")


def test_truncated_arguments_are_rendered_not_refused(recipe):
    # the dsv4 adapter normalises history arguments non-strictly (serving_chat.py:2036-2044, 211-216): a call the
    # model cut off goes back into the prompt as written
    cut = {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Par'}}
    rendered = recipe.render([MESSAGES[0], {**MESSAGES[1], "tool_calls": [cut]}, MESSAGES[2]], TOOLS)
    assert '<｜DSML｜parameter name="city"' not in rendered.text
    assert '{"city": "Par' in rendered.text


def test_the_parse_is_the_releases_own_and_cites_an_executed_line(model):
    from engine.serving.registry import get_engine

    text = "Plan.\n</think>\n\nSure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n" \
           "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n" \
           "</｜DSML｜tool_calls>"
    result = get_engine("sglang@0.5.23").parse(text, reasoning_parser="deepseek-v4", tool_parser="deepseekv4",
                                               tools=TOOLS, chat_template_kwargs={"thinking": True},
                                               tokenizer=model.tokenizer)
    assert (result.reasoning, result.content, [(c.id, c.name, c.arguments) for c in result.tool_calls]) == (
        "Plan.", "Sure.", [("call_<uuid>", "get_weather", '{"city": "Paris"}')])
    # the reasoning first appears where SGLang reads deepseek-recipe's delta; the answer where the serving code takes
    # the adapter's result in place of the model text
    assert {(e.step.split(":")[0], e.location.path, e.location.line) for e in result.edits} == {
        ("reasoning", "sglang/srt/parser/deepseek_recipe_output.py", 202),
        ("content", "sglang/srt/entrypoints/openai/serving_chat.py", 2923)}


def test_timeline_shows_the_recipe_arriving_at_0_5_23():
    require_release("sglang@0.5.22", "sglang@0.5.23")
    from engine.timeline import timeline

    rows = timeline("deepseek-v4", "reasoning-whitespace", "sglang", first="0.5.22", last="0.5.23")
    assert [(r.release, r.status, r.changed) for r in rows] == [
        ("sglang@0.5.22", "holds", False), ("sglang@0.5.23", "breaks", True)]
    assert (rows[1].cause["kind"], rows[1].cause["location"]) == ("reasoning-trimmed",
                                                                  "sglang/srt/parser/deepseek_recipe_output.py:202")
