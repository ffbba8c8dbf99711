"""Output writers and lossless raw splitters, one per output family.

A writer's canonical output must be what the model's own template renders for that assistant turn when it is the
latest turn (the format the model was trained on); where a template renders it differently, the test pins exactly how.
The raw splitter must keep every byte the model wrote.
"""

from __future__ import annotations

import json

import pytest

from engine.assets import resolve_asset
from engine.formats import get_format
from engine.formats.base import AssistantTurn, Knobs, ToolCallSpec
from engine.models import default_model_ids, load_model, load_spec
from engine.simulate import turn_as_written

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
TURNS = {
    "tool": AssistantTurn("I need the weather.", "", (ToolCallSpec("get_weather", {"city": "Paris", "days": 2}),)),
    "answer": AssistantTurn("The user wants a greeting.", "Hello there."),
}
# Kimi's template empties the latest final answer's reasoning unless preserve_thinking=true; the trained format is
# the one with the reasoning, so the comparison renders with it.
KWARGS = {"kimi-k2.6": {"preserve_thinking": True}}


def _latest_turn_rendering(model_id: str, turn: AssistantTurn) -> tuple[str, str]:
    model = load_model(model_id)
    fmt = get_format(model.spec.family)
    kwargs = {**model.spec.default_kwargs(), **KWARGS.get(model_id, {})}
    history = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = model.renderer.render(history, TOOLS, add_generation_prompt=True, kwargs=kwargs).text
    # As the model writes it after this prompt: a model that does not think (or has thinking off) writes no reasoning.
    completion = fmt.write(turn_as_written(model, turn, prompt), model.spec.stop_tokens[0])
    parsed = fmt.raw_parse(completion.parser_text)
    message: dict = {"role": "assistant", "content": parsed.content or "", "reasoning_content": parsed.reasoning}
    if parsed.tool_calls:
        message["tool_calls"] = [{"id": c.id or "call_0", "type": "function",
                                  "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                 for c in parsed.tool_calls]
    full = model.renderer.render([*history, message], TOOLS, add_generation_prompt=False, kwargs=kwargs).text
    assert full.startswith(prompt)
    return completion.text, full[len(prompt):]


@pytest.mark.parametrize("model_id", default_model_ids())
@pytest.mark.parametrize("turn", list(TURNS))
def test_canonical_output_is_what_the_template_renders_for_the_latest_turn(model_id: str, turn: str) -> None:
    written, rendered = _latest_turn_rendering(model_id, TURNS[turn])
    if model_id.startswith("qwen"):
        assert rendered == written + "\n"  # the template adds the newline after <|im_end|>
    elif model_id.startswith("glm"):
        # GLM ends a turn with the next role's token (<|observation|> after a call, <|user|> after an answer): the
        # model emits it as its stop token; the template renders it as the start of the next message.
        stop = "<|observation|>" if turn == "tool" else "<|user|>"
        assert written == rendered + stop
    elif model_id == "gpt-oss" and turn == "tool":
        # The Hub template writes a history call in the header form (`assistant to=…<|channel|>commentary json`) with
        # tojson's spaced arguments; the model emits the channel form harmony documents for its own output.
        assert written == ("<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant<|channel|>"
                           "commentary to=functions.get_weather <|constrain|>json<|message|>"
                           '{"city":"Paris","days":2}<|call|>')
        assert rendered == ("<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant "
                            "to=functions.get_weather<|channel|>commentary json<|message|>"
                            '{"city": "Paris", "days": 2}<|call|>')
    else:
        assert rendered == written


HOSTILE_ARGS = {"city": "Zürich", "n": 1.0, "tag": "007", "ok": True, "x": None, "nest": {"a": [1, 2]}}


@pytest.mark.parametrize(("family", "knobs", "reasoning", "content", "arguments", "call_id"), [
    ("qwen3_xml", Knobs(), "Plan: call it.\n", "\n\n",
     '{"city": "Zürich", "n": "1.0", "tag": "007", "ok": "true", "x": "null", "nest": "{\\"a\\": [1, 2]}"}', None),
    ("qwen3_xml", Knobs(args_json="compact", reasoning_newlines_before=2, newlines_after_think=3),
     "\n\nPlan: call it.\n", "\n\n\n",
     '{"city": "Zürich", "n": "1.0", "tag": "007", "ok": "true", "x": "null", "nest": "{\\"a\\":[1,2]}"}', None),
    ("qwen3_xml", Knobs(truncate_in="arguments"), "Plan: call it.\n", "\n\n",
     '{"city": "Zürich", "n": "1.0", "tag": "007"}', None),
    ("glm", Knobs(), "Plan: call it.", "",
     '{"city": "Zürich", "n": "1.0", "tag": "007", "ok": "true", "x": "null", "nest": "{\\"a\\": [1, 2]}"}', None),
    ("glm", Knobs(args_json="compact", reasoning_newlines_before=2, newlines_after_think=3), "\n\nPlan: call it.",
     "\n\n\n",
     '{"city": "Zürich", "n": "1.0", "tag": "007", "ok": "true", "x": "null", "nest": "{\\"a\\":[1,2]}"}', None),
    ("kimi_k2", Knobs(), "Plan: call it.", "",
     '{"city": "Zürich", "n": 1.0, "tag": "007", "ok": true, "x": null, "nest": {"a": [1, 2]}}',
     "functions.get_weather:0"),
    ("kimi_k2", Knobs(args_json="compact"), "Plan: call it.", "",
     '{"city":"Zürich","n":1.0,"tag":"007","ok":true,"x":null,"nest":{"a":[1,2]}}', "functions.get_weather:0"),
    ("kimi_k2", Knobs(truncate_in="arguments"), "Plan: call it.", "", '{"city": "Zürich", "n": 1.0, "tag": "007", "',
     "functions.get_weather:0"),
    ("dsml", Knobs(), "Plan: call it.", "",
     '{"city": "Zürich", "n": 1.0, "tag": "007", "ok": true, "x": null, "nest": {"a": [1, 2]}}', None),
    ("hermes", Knobs(), "Plan: call it.\n", "\n\n",
     '{"city": "Zürich", "n": 1.0, "tag": "007", "ok": true, "x": null, "nest": {"a": [1, 2]}}', None),
    ("hermes", Knobs(args_json="compact"), "Plan: call it.\n", "\n\n",
     '{"city":"Zürich","n":1.0,"tag":"007","ok":true,"x":null,"nest":{"a":[1,2]}}', None),
    ("hermes", Knobs(truncate_in="arguments"), "Plan: call it.\n", "\n\n",
     '{"city": "Zürich", "n": 1.0, "tag": "007", "', None),
    ("deepseek_v31", Knobs(), "Plan: call it.", "",
     '{"city": "Zürich", "n": 1.0, "tag": "007", "ok": true, "x": null, "nest": {"a": [1, 2]}}', None),
    ("deepseek_v31", Knobs(args_json="compact"), "Plan: call it.", "",
     '{"city":"Zürich","n":1.0,"tag":"007","ok":true,"x":null,"nest":{"a":[1,2]}}', None),
    ("deepseek_v31", Knobs(truncate_in="arguments"), "Plan: call it.", "",
     '{"city": "Zürich", "n": 1.0, "tag": "007", "', None),
    ("harmony", Knobs(), "Plan: call it.", None,
     '{"city":"Zürich","n":1.0,"tag":"007","ok":true,"x":null,"nest":{"a":[1,2]}}', None),
    ("harmony", Knobs(truncate_in="arguments"), "Plan: call it.", None, '{"city":"Zürich","n":1.0,"tag":"007",', None),
])
def test_raw_splitter_keeps_the_models_bytes(family: str, knobs: Knobs, reasoning: str, content: str | None,
                                             arguments: str, call_id: str | None) -> None:
    fmt = get_format(family)
    turn = AssistantTurn("Plan: call it.", "", (ToolCallSpec("get_weather", HOSTILE_ARGS),), knobs)
    completion = fmt.write(turn, "<STOP>")
    parsed = fmt.raw_parse(completion.parser_text)
    assert (parsed.reasoning, parsed.content) == (reasoning, content)
    assert [(c.name, c.arguments, c.id) for c in parsed.tool_calls] == [("get_weather", arguments, call_id)]
    assert parsed.edits == ()
    assert parsed.reasoning is not None and parsed.reasoning in completion.text
    if family in ("qwen3_xml", "glm", "dsml"):
        # One tag per parameter: every value is the model's own text (DSML writes non-strings as JSON), byte for byte.
        values = json.loads(arguments).values()
        assert all((v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) in completion.text for v in values)
    else:
        assert arguments in completion.text


# The models that think (DeepSeek V3.1 when its `thinking` kwarg is on).
THINKING = {m: {"thinking": True} if m == "deepseek-v3.1" else {} for m in default_model_ids()
            if load_spec(m).reasoning != "never"}


@pytest.mark.parametrize("model_id", sorted(THINKING))
def test_raw_split_keeps_reasoning_cut_by_max_tokens_as_reasoning(model_id: str) -> None:
    # The generation prompt opened the think block (harmony names the analysis channel itself), so text cut by
    # max_tokens before the reasoning closed is reasoning, byte for byte; nothing of it is content.
    model = load_model(model_id)
    fmt = get_format(model.spec.family)
    turn = AssistantTurn("Let me think about the weather in Paris first.", "It is sunny.",
                         knobs=Knobs(truncate_in="reasoning", truncate_keep=0.5))
    completion = fmt.write(turn, model.spec.stop_tokens[0])
    history = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = model.renderer.render(history, TOOLS, add_generation_prompt=True,
                                   kwargs={**model.spec.default_kwargs(), **THINKING[model_id]})
    from engine.formats.base import prompt_opens_reasoning

    parsed = fmt.raw_parse(completion.parser_text, reasoning_open=prompt_opens_reasoning(prompt.text))
    assert completion.truncated
    assert parsed.reasoning == "Let me think about the "
    assert parsed.content in ("", None)
    assert parsed.tool_calls == ()


@pytest.mark.parametrize("model_id", default_model_ids())
def test_template_markers_occur_in_the_models_own_template(model_id: str) -> None:
    """The zoo scan matches a template to a format by these markers; each model's own template (or encoder) must
    match its own format, and every format sets some."""
    spec = load_spec(model_id)
    asset = spec.assets.get("chat_template") or spec.assets["encoder"]
    source = resolve_asset(model_id, spec.hub_repo, asset).data.decode("utf-8")
    markers = get_format(spec.family).template_markers
    assert markers
    assert [m for m in markers if m not in source] == []


@pytest.mark.parametrize("model_id", ["qwen3-2507", "qwen2.5", "deepseek-v3.1"])
def test_the_added_formats_markers_pick_no_other_models_template(model_id: str) -> None:
    # The zoo matches a template to the format whose markers all occur in its source (OutputFormat.template_markers).
    model = load_model(model_id)
    fmt = get_format(model.spec.family)
    source = "\n".join(model.renderer.source_lines())
    assert fmt.template_markers and all(marker in source for marker in fmt.template_markers)
    others = [load_model(m) for m in ("qwen3.6", "glm-5.1", "kimi-k2.6", "qwen3-coder")]
    assert not any(all(marker in "\n".join(o.renderer.source_lines()) for marker in fmt.template_markers)
                   for o in others)
