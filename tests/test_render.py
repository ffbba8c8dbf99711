"""Rendering: parity with transformers' apply_chat_template, provenance, and clear errors."""

from __future__ import annotations

import pytest
from conversations import CONVERSATIONS, TOOLS

from engine.errors import RenderError
from engine.models import load_model
from engine.provenance import spans
from engine.render.jinja import JinjaRenderer

JINJA_MODELS = ["qwen3.6", "qwen3.5", "glm-5.1", "kimi-k2.6", "gpt-oss",
                "qwen3-coder", "qwen3-2507", "qwen2.5", "glm-4.7-flash", "deepseek-v3.1"]
KWARG_VARIANTS = {
    "qwen3.6": [{}, {"preserve_thinking": True}, {"enable_thinking": False}],
    "qwen3.5": [{}, {"enable_thinking": True}],
    "glm-5.1": [{}, {"clear_thinking": False}, {"enable_thinking": False}],
    "kimi-k2.6": [{}, {"preserve_thinking": True}, {"thinking": False}],
    "gpt-oss": [{}, {"reasoning_effort": "high"}],
    "qwen3-coder": [{}],
    "qwen3-2507": [{}],
    "qwen2.5": [{}],
    "glm-4.7-flash": [{}, {"clear_thinking": False}, {"enable_thinking": False}],
    "deepseek-v3.1": [{}, {"thinking": True}],
}


@pytest.mark.parametrize("model_id", JINJA_MODELS)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_jinja_render_matches_transformers(model_id: str, conversation: str, generation_prompt: bool) -> None:
    model = load_model(model_id)
    messages, tools = CONVERSATIONS[conversation]
    for kwargs in KWARG_VARIANTS[model_id]:
        try:
            theirs = model.renderer.render_reference(messages, tools, add_generation_prompt=generation_prompt,
                                                     kwargs=kwargs)
        except Exception as their_error:  # noqa: BLE001 - the same inputs must fail the same way in ours
            with pytest.raises(RenderError) as caught:
                model.renderer.render(messages, tools, add_generation_prompt=generation_prompt, kwargs=kwargs)
            assert str(their_error) in str(caught.value)
            continue
        ours = model.renderer.render(messages, tools, add_generation_prompt=generation_prompt, kwargs=kwargs)
        assert ours.text == theirs
        assert len(ours.message_index) == len(ours.text) == len(ours.source_line)


def _line_of(rendered, needle: str, model) -> tuple[int, str, int]:
    at = rendered.text.index(needle)
    line = rendered.source_line[at]
    return line, model.renderer.source_lines()[line - 1], rendered.message_index[at]


def test_provenance_points_at_the_emitting_template_line() -> None:
    model = load_model("qwen3.5")
    messages, tools = CONVERSATIONS["tool-round"]
    rendered = model.renderer.render(messages, tools, add_generation_prompt=True, kwargs={"enable_thinking": True})
    line, text, message = _line_of(rendered, "<parameter=city>", model)
    assert (line, message) == (121, 2)
    assert "'<parameter=' + args_name + '>\\n'" in text
    line, text, message = _line_of(rendered, "sunny, 21C", model)
    assert (line, message) == (136, 3)
    assert text.strip() == "{{- content }}"
    # The generation prompt is scaffolding: no message, the enable_thinking branch's line.
    at = rendered.text.rindex("<think>\n")
    assert rendered.message_index[at] == -1
    assert model.renderer.source_lines()[rendered.source_line[at] - 1].strip() == "{{- '<think>\\n' }}"


def test_provenance_follows_output_into_macros() -> None:
    model = load_model("kimi-k2.6")
    messages, tools = CONVERSATIONS["tool-round"]
    rendered = model.renderer.render(messages, tools, add_generation_prompt=True)
    line, text, message = _line_of(rendered, "<|tool_calls_section_begin|>", model)
    assert (line, message) == (31, 2)
    assert text.strip() == "<|tool_calls_section_begin|>"


def test_qwen_history_reasoning_dropped_at_line_103() -> None:
    model = load_model("qwen3.6")
    messages, tools = CONVERSATIONS["full-round-next-user"]
    rendered = model.renderer.render(messages, tools, add_generation_prompt=True)
    assert "Call the tool." not in rendered.text
    line, text, _ = _line_of(rendered, "<|im_start|>assistant\nIt is sunny", model)
    assert line == 103 and "'<|im_start|>' + message.role + '\\n' + content" in text
    kept = model.renderer.render(messages, tools, add_generation_prompt=True, kwargs={"preserve_thinking": True})
    assert "<think>\nCall the tool.\n</think>\n\n" in kept.text


def test_spans_cover_the_text() -> None:
    model = load_model("glm-5.1")
    messages, tools = CONVERSATIONS["tool-round"]
    rendered = model.renderer.render(messages, tools, add_generation_prompt=True)
    covered = spans(rendered)
    assert "".join(rendered.text[s.start:s.end] for s in covered) == rendered.text
    assert all(s.source_line > 0 for s in covered)


def test_raise_exception_names_model_file_and_line() -> None:
    model = load_model("qwen3.5")
    with pytest.raises(RenderError) as caught:
        model.renderer.render([{"role": "assistant", "content": "hi"}], None, add_generation_prompt=True)
    assert str(caught.value) == (
        "Qwen-Qwen3.5-0.8B.jinja for model qwen3.5 raised at line 79: No user query found in messages."
    )
    assert caught.value.source_line == 79


def test_template_that_does_not_parse_is_a_clear_error() -> None:
    with pytest.raises(RenderError) as caught:
        JinjaRenderer("{% for m in messages %}{{ m.content }", model="custom", source_path="broken.jinja")
    assert str(caught.value).startswith("broken.jinja for model custom does not parse: ")
    assert caught.value.source_line == 1


def test_tools_render_in_every_tool_template() -> None:
    # DeepSeek V3.1's template renders no tool list at all (its model card puts the tools in the system message).
    assert "get_weather" not in load_model("deepseek-v3.1").renderer.render(
        [{"role": "user", "content": "x"}], TOOLS, add_generation_prompt=True).text
    for model_id in (m for m in JINJA_MODELS if m != "deepseek-v3.1"):
        rendered = load_model(model_id).renderer.render([{"role": "user", "content": "x"}], TOOLS,
                                                        add_generation_prompt=True)
        assert "get_weather" in rendered.text, model_id


def test_harmony_renders_object_arguments_as_json_text() -> None:
    model = load_model("gpt-oss", renderer="harmony")
    messages, tools = CONVERSATIONS["tool-round"]
    rendered = model.renderer.render(messages, tools, add_generation_prompt=True,
                                     kwargs={"conversation_start_date": "2026-11-30"})
    # openai-harmony 0.0.8 writes history calls in the header style `assistant to=… <|channel|>commentary json`.
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            "<|call|>") in rendered.text


REMEMBERED_VERDICT_TEMPLATES = {
    # (template, what transformers' sandbox does with it): the remembered verdicts must answer exactly the same.
    "{{ messages[0].role }}|{{ messages[0].items is callable }}|{{ messages[0].nope }}|{{ messages[0]['content'] }}":
        "render",
    "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages[0].keys() | list | join(',') }}": "render",
    "{{ messages.append(1) }}": "refuse",
    "{{ messages[0].update({'role': 'x'}) }}": "refuse",
    "{{ messages.__class__ }}": "render",  # unsafe attribute: undefined, rendered empty
    "{{ messages[0].pop('role') }}": "refuse",
}


@pytest.mark.parametrize("source", sorted(REMEMBERED_VERDICT_TEMPLATES))
def test_remembered_sandbox_verdicts_match_transformers(source: str) -> None:
    renderer = JinjaRenderer(source, model="probe", source_path="probe.jinja")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    for _ in range(2):  # the second pass answers from memory
        try:
            theirs = renderer.render_reference(messages, None, add_generation_prompt=False)
        except Exception as their_error:  # noqa: BLE001
            assert REMEMBERED_VERDICT_TEMPLATES[source] == "refuse"
            with pytest.raises(RenderError) as caught:
                renderer.render(messages, None, add_generation_prompt=False)
            assert str(their_error) in str(caught.value)
            continue
        assert REMEMBERED_VERDICT_TEMPLATES[source] == "render"
        ours = renderer.render(messages, None, add_generation_prompt=False)
        assert ours.text == theirs
        assert len(ours.source_line) == len(theirs)


def test_messages_converted_once_equal_transformers_conversion() -> None:
    # JinjaRenderer converts each distinct message once (the same earlier messages come with every request of a
    # session); the template must see exactly what transformers' own conversion of the whole list gives.
    from transformers.utils import chat_template_utils as ctu

    renderer = load_model("qwen3.6").renderer.inner
    renderer.cache_clear()
    tool_call = {"type": "function", "function": {"name": "f", "arguments": {"a": (1, 2), "b": 1.0, "c": True}}}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q", "name": None},
        {"role": "assistant", "content": "", "reasoning": "r", "tool_calls": [tool_call]},
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": "1"},  # equal to the one before: still its own object
        {"role": "assistant", "content": None, "thinking": "t", "tool_calls": [{**tool_call, "id": 1}]},
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
    ]
    expected = ctu._alias_reasoning_fields(ctu._plain_template_data(ctu._normalize_chat_messages(messages)))
    for _ in range(2):  # converted, then from the memo
        chat, _ = renderer.template_context(messages, None, True, {})
        assert chat == expected
        assert [type(m) for m in chat] == [dict] * len(messages)
        assert len({id(m) for m in chat}) == len(messages)
    assert chat[2]["tool_calls"][0]["function"]["arguments"]["a"] == (1, 2)  # a tuple stays a tuple
    assert len(renderer._message_memo) == 6
    # 1, 1.0 and True are different messages to a template (`is integer`, tojson): keyed apart.
    for value in (1, 1.0, True):
        chat, _ = renderer.template_context([{"role": "user", "content": value}], None, True, {})
        assert type(chat[0]["content"]) is type(value)
