"""The layers between the model and the cache (issue 27): template runtimes, proxies and client profiles, server flags.

Each runtime test renders constructs alone under transformers' Jinja and under the runtime (engine.runtime_compare
.isolate) and pins both outputs exactly; the cell tests pin where a layer's break is located and the re-run that
proves it."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.render.runtimes import RuntimeRenderer, minijinja_source, runtime
from engine.runtime_compare import REFERENCE, isolate
from engine.scenario import scenario_from_data
from engine.serving.spec import EngineSpec

NODE = shutil.which("node") is not None and shutil.which("npm") is not None
needs_node = pytest.mark.skipif(not NODE, reason="@huggingface/jinja runs on Node.js, which is not installed here "
                                                 "(.ci/run installs it)")


@pytest.fixture(scope="module")
def qwen25():
    from engine.models import load_model

    return load_model("qwen2.5")


def _renderer(model, name: str) -> RuntimeRenderer:
    return RuntimeRenderer(model.renderer, runtime(name))


# Constructs MiniJinja renders otherwise than transformers' Jinja, each rendered alone with the same inputs:
# (the expression, its inputs, transformers' output, MiniJinja's output).
MINIJINJA = [
    ("x|tojson", {"x": {"q": "a <b> & 'c'"}}, '{"q": "a <b> & \'c\'"}',
     '{"q": "a \\u003cb\\u003e \\u0026 \\u0027c\\u0027"}'),
    ("tools is iterable", {"tools": None}, "False", "True"),
    ("content is sequence", {"content": "text"}, "True", "False"),
]
# ... and @huggingface/jinja (Node receives the inputs as JSON).
HFJS = [
    ("x|tojson", {"x": {"min_score": 1.0}}, '{"min_score": 1.0}', '{"min_score": 1}'),
    ("content", {"content": None}, "None", ""),
    ("reasoning.rstrip('\\n')", {"reasoning": "done. \n"}, "done. ", "done."),
    ("flag", {"flag": True}, "True", "true"),
]


@pytest.mark.parametrize(("body", "inputs", "reference", "theirs"), MINIJINJA, ids=[c[0] for c in MINIJINJA])
def test_minijinja_renders_these_constructs_otherwise(qwen25, body: str, inputs: dict, reference: str,
                                                      theirs: str) -> None:
    contrast = isolate(_renderer(qwen25, "minijinja"), body, inputs)
    assert contrast is not None
    assert (contrast.reference_output, contrast.runtime_output) == (reference, theirs)
    assert contrast.reference == REFERENCE and contrast.runtime.startswith("MiniJinja 3.1.0")


@needs_node
@pytest.mark.parametrize(("body", "inputs", "reference", "theirs"), HFJS, ids=[c[0] for c in HFJS])
def test_hfjs_renders_these_constructs_otherwise(qwen25, body: str, inputs: dict, reference: str, theirs: str) -> None:
    contrast = isolate(_renderer(qwen25, "hfjs"), body, inputs)
    assert contrast is not None
    assert (contrast.reference_output, contrast.runtime_output) == (reference, theirs)
    assert contrast.runtime == "@huggingface/jinja 0.5.13"


def test_the_innermost_differing_part_is_the_construct(qwen25) -> None:
    """In a whole output, the part that differs alone is named (the tojson), not the concatenation around it."""
    contrast = isolate(_renderer(qwen25, "minijinja"), "'<tool_call>' + (args|tojson) + '</tool_call>'",
                       {"args": {"q": "<"}})
    assert contrast is not None
    assert contrast.construct == "{{ ((args)|tojson) }}"
    assert (contrast.reference_output, contrast.runtime_output) == ('{"q": "<"}', '{"q": "\\u003c"}')
    assert json.loads(contrast.inputs) == {"args": {"q": "<"}}


def test_the_minijinja_bridge_rewrites_only_the_calls_it_would_refuse() -> None:
    assert minijinja_source("{{ x|tojson }}{{ y|tojson(indent=4) }}") == "{{ x|tojson }}{{ y|tojson(indent=4) }}"
    assert minijinja_source("{{ v | tojson(ensure_ascii=False) if v is not string else v }}") == \
        "{{ v | tojson if v is not string else v }}"
    assert minijinja_source("{{ t|tojson(separators=(',', ':')) }}") == "{{ t|drift_tojson(separators=(',', ':')) }}"
    engine = runtime("minijinja")
    assert engine.render_many("{{ t|tojson(separators=(',', ':')) }}", [{"t": {"a": [1, 2]}}]) == ['{"a":[1,2]}']
    assert engine.render_many("{{ raise_exception('no such role') }}", [{}]) == ["no such role"]


@needs_node
def test_one_node_process_serves_many_renders() -> None:
    engine = runtime("hfjs")
    started = engine.started
    for index in range(30):
        assert engine.render_many("{{ n + 1 }}", [{"n": index}, {"n": -index}]) == [str(index + 1), str(1 - index)]
    assert engine.started == max(started, 1)


def test_no_node_means_an_unavailable_column_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.render import runtimes

    monkeypatch.setattr(runtimes.shutil, "which", lambda name: None)
    with pytest.raises(runtimes.RuntimeUnavailable) as raised:
        runtimes.HfJinjaRuntime()
    assert str(raised.value) == ("Node.js is not installed here: the @huggingface/jinja column runs the package with "
                                 "node (18 or newer) on PATH")


# A conversation whose arguments the Qwen2.5 template prints as transformers does (json.dumps' own spacing), with
# text and a float two runtimes print otherwise: raw holds, the runtimes break at the arguments' tojson.
ARGUMENTS = scenario_from_data({
    "id": "runtime-arguments", "description": "arguments with <, & and 1.0, written as json.dumps writes them",
    "preamble": "coding-agent", "tools": ["search"], "turns": [
        {"user": "Search."},
        {"assistant": {"reasoning": "I will search.",
                       "tool_calls": [{"name": "search", "arguments": {"query": "a <b> & 'c'", "min_score": 1.0}}]}},
        {"tool": "3 results"}]}, "tests/test_layers.py")


@pytest.mark.parametrize(("column", "printed"), [
    ("raw@minijinja", '{"query": "a \\u003cb\\u003e \\u0026 \\u0027c\\u0027", "min_score": 1.0}'),
    pytest.param("raw@hfjs", '{"query": "a <b> & \'c\'", "min_score": 1}', marks=needs_node),
])
def test_a_runtime_break_is_located_at_the_construct_and_proved(qwen25, column: str, printed: str) -> None:
    from engine.simulate import run_cell_with

    assert run_cell_with(qwen25, ARGUMENTS, "raw", {}).status == "holds"
    cell = run_cell_with(qwen25, ARGUMENTS, column, {})
    cause = cell.cause
    assert (cell.status, cause.stage, cause.kind, str(cause.location)) == (
        "breaks", "runtime", "runtime-differs", "Qwen-Qwen2.5-7B-Instruct.jinja:36")
    assert cause.location.text == "{{- tool_call.arguments | tojson }}"
    assert cause.contrast.construct == "{{ tool_call.arguments | tojson }}"
    assert cause.contrast.reference_output == '{"query": "a <b> & \'c\'", "min_score": 1.0}'
    assert cause.contrast.runtime_output == printed
    assert cause.proof.startswith(f"re-run with {REFERENCE} instead of ")
    assert "(raw): the boundary holds; rendered alone with the same inputs" in cause.proof
    assert (cause.fix.kind, cause.fix.engine, cause.fix.proof) == ("engine", "raw",
                                                                   "re-run with raw: the boundary holds")
    assert cell.column == column and cell.layers[-1].endswith("(template runtime)")
    assert "request 2's prompt differs from transformers' Jinja" in cell.note


def test_a_model_without_a_jinja_template_has_no_runtime_column() -> None:
    from engine.simulate import run_cell

    cell = run_cell("deepseek-v4", "tool-call", "raw@minijinja", explain=False)
    assert (cell.status, cell.note) == ("unavailable", "deepseek-v4 is rendered by encoding_dsv4.py, not a Jinja "
                                                      "template: there is no template for minijinja to render")
    cell = run_cell("gpt-oss", "tool-call", "vllm+minijinja", explain=False)
    assert cell.status == "unavailable" and cell.note.startswith("vllm@0.33.0 renders gpt-oss with ")


def test_a_client_profile_is_data_and_each_step_cites_its_code() -> None:
    from engine.serving.proxies.profiles import profile, profile_names

    assert profile_names() == ["langchain-openai", "reasoning-field"]
    for name in profile_names():
        found = profile(name)
        assert found.code and all(step.cite and step.line > 0 for step in found.steps)
    steps = profile("langchain-openai").steps
    assert [(s.op, s.field, s.when, s.line) for s in steps] == [
        ("drop", "reasoning_content", None, 7), ("drop", "reasoning", None, 9), ("empty_content", "content",
                                                                                 "tool_calls", 11)]


def test_a_profile_that_drops_the_reasoning_is_the_cause_at_its_line() -> None:
    from engine.simulate import run_cell

    cell = run_cell("qwen3.6", "tool-call", "raw+langchain-openai")
    cause = cell.cause
    assert (cell.status, cause.stage, cause.kind, str(cause.location)) == (
        "breaks", "proxy", "proxy-rewrote", "proxy_profiles/langchain-openai.yaml:7")
    assert cause.location.text.startswith("base.py:481-516: an assistant dict holds content")
    assert cause.proof == "re-run without langchain-openai (raw): the boundary holds"
    assert (cause.edit.step, cause.edit.before) == ("reasoning_content_dropped", "messages[2].reasoning_content")
    assert cell.layers == ("langchain-openai (client profile: langchain-openai 1.8.1, "
                           "langchain_openai/chat_models/base.py:476-558 (_convert_message_to_dict))",)


def test_a_layered_cell_names_its_column_and_a_plain_one_does_not() -> None:
    from engine.matrix import cell_json
    from engine.simulate import run_cell

    plain = cell_json(run_cell("qwen3.6", "tool-call", "raw", explain=False))
    layered = cell_json(run_cell("qwen3.6", "tool-call", EngineSpec.parse("raw+minijinja"), explain=False))
    assert "column" not in plain and "layers" not in plain
    assert (layered["column"], layered["layers"]) == ("raw@minijinja", ["MiniJinja 3.1.0 (template runtime)"])


def test_litellm_1_104_drops_the_reasoning_and_1_110_keeps_it() -> None:
    from engine.simulate import run_cell
    from tests.conftest import require_release

    require_release("litellm@1.104.9", "litellm@1.110.2", "vllm@0.33.0")
    cell = run_cell("qwen3.6", "tool-call", "vllm+litellm@1.104.9")
    cause = cell.cause
    assert (cell.status, cause.stage, str(cause.location), cause.location.text) == (
        "breaks", "proxy", "litellm/llms/hosted_vllm/chat/transformation.py:170",
        'message.pop("reasoning_content", None)')
    assert cause.proof == "re-run without litellm@1.104.9 (vllm): the boundary holds"
    assert (cause.fix.engine, cause.fix.proof) == ("vllm+litellm", "re-run with vllm+litellm: the boundary holds")
    assert run_cell("qwen3.6", "tool-call", "vllm+litellm", explain=False).status == "holds"


def test_strip_thinking_cache_keeps_the_prompt_not_the_reply() -> None:
    from engine.simulate import run_cell
    from tests.conftest import require_release

    require_release("sglang@0.5.23")
    plain = run_cell("qwen3.6", "tool-call", "sglang@0.5.23", explain=False)
    cell = run_cell("qwen3.6", "tool-call", "sglang@0.5.23[strip-thinking-cache]")
    boundary, cause = cell.focus, cell.cause
    assert plain.status == "holds" and cell.status == "breaks"
    assert boundary.token_prefix.common == len(boundary.prev_prompt_ids)
    assert boundary.token_prefix.prev_len == plain.focus.token_prefix.prev_len
    assert (cause.stage, cause.kind, str(cause.location), cause.location.text) == (
        "cache", "cache-dropped", "sglang/srt/managers/schedule_batch.py:1555",
        "if get_serving().strip_thinking_cache and self.reasoning_tokens > 0:")
    assert cause.proof == "re-run without --strip-thinking-cache (sglang@0.5.23): the boundary holds"


def test_default_template_kwargs_of_the_server_apply_where_the_request_sets_none() -> None:
    from engine.simulate import run_cell
    from tests.conftest import require_release

    require_release("vllm@0.33.0")
    assert run_cell("qwen3.6", "next-user-turn", "vllm", explain=False).status == "breaks"
    cell = run_cell("qwen3.6", "next-user-turn", 'vllm@0.33.0[default-chat-template-kwargs={"preserve_thinking":true}]',
                    explain=False)
    assert (cell.status, cell.kwargs) == ("holds", {"enable_thinking": True})
    # A kwarg the user sets wins over the server's default, as in the release's code.
    cell = run_cell("qwen3.6", "next-user-turn", 'vllm@0.33.0[default-chat-template-kwargs={"preserve_thinking":true}]',
                    {"preserve_thinking": False}, explain=False)
    assert cell.status == "breaks"


@needs_node
def test_a_value_computed_by_a_set_is_located_at_the_assignment() -> None:
    """Qwen3.6 prints a parameter's value that a `set` computed (`args_value | tojson`); under SGLang, which converts
    the arguments by the tool schema, @huggingface/jinja prints 1.0 as 1 there: the set's taken branch is the
    construct, the output that printed it second."""
    from engine.simulate import run_cell
    from tests.conftest import require_release

    require_release("sglang@0.5.23")
    cell = run_cell("qwen3.6", "args-serialization", "sglang+hfjs")
    cause = cell.cause
    assert (cause.stage, [str(loc) for loc in cause.locations]) == (
        "runtime", ["Qwen-Qwen3.6-35B-A3B.jinja:122", "Qwen-Qwen3.6-35B-A3B.jinja:123"])
    assert (cause.contrast.construct, cause.contrast.inputs) == ("{{ ((args_value)|tojson) }}", '{"args_value": 1.0}')
    assert (cause.contrast.reference_output, cause.contrast.runtime_output) == ("1.0", "1")
    assert "(sglang): the break moves from character 4817 of 5033 to 4932 of 5033" in cause.proof
