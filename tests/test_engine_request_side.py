"""Each engine column renders what that engine release's own request-side code renders (text and token ids), for
every model and scenario: vllm (0.33.0), sglang@0.5.23 and sglang@0.5.12, checked against the pinned wheels'
sources run in the sandboxed worker (engine/serving/proof.py). Plus the renderer table's facts, the figures the
engine's own renderer moves, and the cells an engine release cannot serve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.models import model_ids
from engine.serving.rendering import serving_rule
from engine.simulate import run_cell
from tests.test_real_engines import need  # skips (outside CI) when a release is neither cached nor fetchable

COLUMNS = {"vllm": "vllm@0.33.0", "sglang@0.5.23": "sglang@0.5.23", "sglang@0.5.12": "sglang@0.5.12"}


@pytest.mark.parametrize(("engine", "version", "model_type", "renderer"), [
    ("vllm", "0.10.0", "gpt_oss", "unavailable"),
    ("vllm", "0.10.1", "gpt_oss", "harmony"),
    ("vllm", "0.33.0", "gpt_oss", "harmony"),
    ("vllm", "0.19.1", "deepseek_v4", "unavailable"),
    ("vllm", "0.20.0", "deepseek_v4", "engine_encoder"),
    ("vllm", "0.33.0", "deepseek_v4", "engine_encoder"),
    ("sglang", "0.5.11", "deepseek_v4", "unavailable"),
    ("sglang", "0.5.12", "deepseek_v4", "engine_encoder"),
    ("sglang", "0.5.16", "deepseek_v4", "engine_encoder"),
    ("sglang", "0.5.22", "deepseek_v4", "engine_encoder"),
    ("sglang", "0.5.23", "deepseek_v4", "deepseek_recipe"),
    ("sglang", "0.5.5.post3", "deepseek_v32", "unavailable"),
    ("sglang", "0.5.6", "deepseek_v32", "engine_encoder"),
    ("sglang", "0.5.23", "deepseek_v32", "engine_encoder"),
    ("vllm", "0.12.0", "deepseek_v32", "unavailable"),
    ("vllm", "0.13.0", "deepseek_v32", "engine_encoder"),
    ("vllm", "0.33.0", "deepseek_v32", "engine_encoder"),
    ("sglang", "0.5.23", "gpt_oss", None),
    ("vllm", "0.33.0", "", None),
    ("vllm", "0.19.1", "mistral3", "unavailable"),
    ("vllm", "0.20.0", "mistral3", None),
    ("sglang", "0.5.1", "mistral3", None),
])
def test_the_table_names_the_renderer_each_release_uses(engine, version, model_type, renderer):
    rule = serving_rule(engine, version, model_type)
    assert (rule.renderer if rule else None) == renderer


@pytest.mark.parametrize("column", list(COLUMNS))
@pytest.mark.parametrize("model_id", model_ids())
def test_the_column_renders_what_the_engine_renders(model_id, column):
    from engine.scenario import scenario_ids
    from engine.serving.proof import prove_cell

    need(COLUMNS[column])
    checked = 0
    for scenario in scenario_ids():
        for proof in prove_cell(model_id, scenario, column):
            assert proof.equal, f"{model_id} × {scenario} × {column}: {proof.first_difference()}"
            checked += 1
    # every boundary of every cell that runs (some do not apply); Mistral's template refuses SGLang's call ids
    # ("call_" and 24 hex digits, not 9 alphanumerics), so only its calls-free cells run there (vLLM's mistral parser
    # makes 9-alphanumeric ids, which the template takes)
    refused = model_id == "mistral-small-3.2" and column.startswith("sglang")
    assert checked >= (3 if refused else len(scenario_ids()) // 2)


def test_vllm_renders_deepseek_v4_with_its_bundled_encoder():
    need("vllm@0.33.0")
    # vLLM's copy of the encoder writes the reasoning-effort preamble for "high" (the original only for "max"),
    # so the prompt the model continues is 79 tokens longer than the Hub encoder's.
    vllm = run_cell("deepseek-v4", "reasoning-truncated", "vllm")
    raw = run_cell("deepseek-v4", "reasoning-truncated", "raw")
    assert (vllm.focus.token_prefix.prev_len, raw.focus.token_prefix.prev_len) == (1089, 1010)
    assert vllm.focus.next_prompt.source_path == "vllm/tokenizers/deepseek_v4_encoding.py"
    assert vllm.renderer == "vllm 0.33.0 encoder (vllm/tokenizers/deepseek_v4_encoding.py)"
    assert vllm.request_side == "vllm 0.33.0 real code (vllm/tokenizers/deepseek_v4.py:22-66)"
    dropped = run_cell("deepseek-v4", "no-tools-next-user", "vllm")
    # The construct counterfactuals run in the worker over vLLM's encoder: the condition that drops the reasoning.
    assert (dropped.cause.kind, str(dropped.cause.location)) == ("reasoning-dropped",
                                                            "vllm/tokenizers/deepseek_v4_encoding.py:427-432")
    assert dropped.cause.fix.text == "set drop_thinking=false"


def test_vllm_renders_deepseek_v3_2_through_its_deepseek_v32_tokenizer_mode():
    """vLLM serves a DeepseekV32ForCausalLM checkpoint (no chat template) in its deepseek_v32 tokenizer mode: the
    mode's renderer hands the conversation to the bundled V3.2 encoder, run in the release's worker."""
    need("vllm@0.33.0", "vllm@0.16.0", "vllm@0.12.0")
    cell = run_cell("deepseek-v3.2", "args-serialization", "vllm")
    assert cell.renderer == "vllm 0.33.0 encoder (vllm/tokenizers/deepseek_v32_encoding.py)"
    assert cell.request_side == ("vllm 0.33.0 real code (vllm/tokenizers/deepseek_v32.py:22-60 (tokenizer mode "
                                 "deepseek_v32), vllm/renderers/deepseek_v32.py:35-60)")
    assert cell.focus.next_prompt.source_path == "vllm/tokenizers/deepseek_v32_encoding.py"
    # The encoder writes `</think>` alone in chat mode, in the generation prompt and in history alike: what breaks
    # is vLLM's parser coercing the arguments by schema, not the Jinja port's `<think></think>` (lines 58-65); the
    # release's own parser, traced at the break, names the line that set them.
    assert (cell.focus.token_prefix.prev_len, cell.focus.token_prefix.common) == (1251, 1157)
    assert (cell.cause.kind, str(cell.cause.location)) == ("args-type-coerced",
                                                      "vllm/parser/engine/parser_engine.py:1191")
    assert run_cell("deepseek-v3.2", "tool-call", "vllm").status == "holds"
    raw = run_cell("deepseek-v3.2", "tool-call", "raw")
    assert (raw.status, raw.renderer) == ("breaks", "template deepseek-v3.2 (deepseek-ai-DeepSeek-V3.2.jinja: "
                                                    "llama.cpp's Jinja port of DeepSeek's encoding_dsv32.py)")
    # 0.16's renderer keeps its tokenizer behind a read-only property; before 0.13 there is no V3.2 renderer.
    assert run_cell("deepseek-v3.2", "tool-call", "vllm@0.16.0").status == "holds"
    old = run_cell("deepseek-v3.2", "tool-call", "vllm@0.12.0")
    assert (old.status, old.note) == ("unavailable", (
        "vllm@0.12.0 cannot serve deepseek-v3.2: it has no DeepSeek V3.2 renderer (its deepseek_v32 tokenizer mode, "
        "vllm/tokenizers/deepseek_v32.py, arrived in 0.13.0) and the model ships no chat template."))


def test_every_deepseek_v3_2_cell_says_which_encoder_rendered_it():
    """In the default matrix (the snapshot test_snapshot.py keeps equal to `python -m engine matrix --json -`)."""
    snapshot = json.loads((Path(__file__).parent / "snapshots" / "default_matrix.json").read_text(encoding="utf-8"))
    renderers = {(c["engine"], c["renderer"]) for c in snapshot["cells"] if c["model"] == "deepseek-v3.2"
                 and c["engine"] != "renderers"}
    port = "template deepseek-v3.2 (deepseek-ai-DeepSeek-V3.2.jinja: llama.cpp's Jinja port of DeepSeek's " \
           "encoding_dsv32.py)"
    assert renderers == {("vllm", "vllm 0.33.0 encoder (vllm/tokenizers/deepseek_v32_encoding.py)"),
                         ("sglang", "sglang 0.5.23 encoder (sglang/srt/entrypoints/openai/encoding_dsv32.py)"),
                         ("raw", port), ("bridge", port)}
    # The renderers column has no V3.2 renderer: unavailable, with its sentence.
    assert {c["status"] for c in snapshot["cells"] if c["model"] == "deepseek-v3.2" and c["engine"] == "renderers"} \
        == {"unavailable"}


def test_vllm_renders_gpt_oss_through_harmony():
    cell = run_cell("gpt-oss", "reasoning-truncated", "vllm")
    # The Hub template raises on the truncated reasoning (line 314); openai-harmony renders it and the prefix holds.
    assert cell.status == "holds"
    assert (cell.focus.string_prefix.common, cell.focus.token_prefix.common) == (3861, 840)
    assert cell.renderer.startswith("openai-harmony 0.0.8")
    assert run_cell("gpt-oss", "reasoning-truncated", "sglang").renderer.startswith("template gpt-oss")
    assert run_cell("gpt-oss", "reasoning-truncated", "raw").status == "error"


def test_a_harmony_prompt_the_release_rendered_carries_the_day_it_was_asked_for(monkeypatch):
    """vLLM writes the conversation's start date into GPT-OSS's system message (today, unless VLLM_SYSTEM_START_DATE
    pins it). The day is part of the job, so an answer kept in the result cache on one day is not read back on the
    next: after midnight, the kept answer's date differed from the column's."""
    need("vllm@0.33.0")
    from engine.models import load_model
    from engine.serving.real.backend import RealEngine

    job = {"renderer": "harmony", "harmony": True, "messages": [{"role": "user", "content": "What day is it?"}],
           "tools": None, "model_type": "gpt_oss", "reasoning_parser": None, "tool_parser": None,
           "reasoning_effort": None, "chat_template_kwargs": None}
    prompts = []
    tokenizer = load_model("gpt-oss").tokenizer
    for day in ("2026-01-01", "2026-01-02", "2026-01-01"):  # the third read back from the cache, when it holds it
        monkeypatch.setenv("VLLM_SYSTEM_START_DATE", day)
        prompts.append(RealEngine("vllm", "0.33.0").render_request(dict(job), tokenizer)["prompt"])
    assert [p[p.index("Current date: "):][:len("Current date: 2026-01-01")] for p in prompts] == [
        "Current date: 2026-01-01", "Current date: 2026-01-02", "Current date: 2026-01-01"]


def test_a_release_without_the_renderer_cannot_serve_the_model():
    need("vllm@0.19.1", "sglang@0.5.11")
    cell = run_cell("deepseek-v4", "tool-call", "vllm@0.19.1")
    assert cell.status == "unavailable"
    assert cell.note == ("vllm@0.19.1 cannot serve deepseek-v4: it has no DeepSeek V4 renderer "
                         "(vllm/tokenizers/deepseek_v4.py arrived in 0.20.0) and the model ships no chat template.")
    assert run_cell("deepseek-v4", "tool-call", "sglang@0.5.11").status == "unavailable"


def test_vllm_0_16_renders_through_its_own_hf_renderer():
    """0.15-0.16's HfRenderer keeps the tokenizer behind a read-only property and the model config as `config`:
    the glue sets what that release's __init__ sets, and the next prompt is the one the release renders."""
    from engine.serving.proof import prove_cell

    need("vllm@0.16.0")
    for scenario in ("tool-call", "no-tools-next-user", "parallel-tool-calls"):
        proofs = list(prove_cell("qwen3.6", scenario, "vllm@0.16.0"))
        assert [p.equal for p in proofs] == [True], scenario
    cell = run_cell("qwen3.6", "tool-call", "vllm@0.16.0")
    assert (cell.status, cell.request_side) == (
        "holds", "vllm 0.16.0 real code (vllm/renderers/hf.py HfRenderer.render_messages)")
    glm = run_cell("glm-5.1", "tool-call", "vllm@0.16.0")
    assert (glm.status, glm.cause.kind, str(glm.cause.location)) == (
        "breaks", "reasoning-dropped", "vllm/renderers/hf.py:632")


def test_vllm_0_21_ignores_the_clients_reasoning_content():
    """The release's own request side: vLLM 0.20-0.21 read only `reasoning`; 0.22.0's protocol renames the
    client's reasoning_content to reasoning again, and the history keeps its reasoning."""
    need("vllm@0.21.0", "vllm@0.22.0")
    old = run_cell("glm-5.1", "reasoning-whitespace", "vllm@0.21.0")
    assert old.status == "breaks" and old.cause.kind == "reasoning-dropped"
    assert str(old.cause.location).startswith("vllm/renderers/hf.py:")
    assert old.request_side == "vllm 0.21.0 real code (vllm/renderers/hf.py HfRenderer.render_messages)"
    assert run_cell("glm-5.1", "reasoning-whitespace", "vllm@0.22.0").status == "holds"


def test_sglang_hands_the_template_its_pydantic_dump_of_the_tools():
    from engine.serving.registry import get_engine

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert get_engine("sglang@0.5.23").served_tools(tools) == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "description": None},
         "defer_loading": None}]
    # 0.5.12 (no emulation: its own request side) dumps the Function model's fields in their declared order
    need("sglang@0.5.12")
    prep = get_engine("sglang@0.5.12").prepare_templated_request(
        [{"role": "user", "content": "hi"}], tools, kwargs={}, chat_template="{{ messages }}",
        parsers={"tool_call_parser": "qwen25"})
    assert prep.tools == [
        {"type": "function", "function": {"description": None, "name": "f", "parameters": {"type": "object"},
                                          "strict": False}, "defer_loading": None}]


def test_sglang_0_5_23_renders_deepseek_v4_through_deepseek_recipe():
    need("sglang@0.5.23")
    # Like vLLM's encoder, the recipe writes the reasoning-effort preamble: 79 tokens more than the Hub encoder.
    cell = run_cell("deepseek-v4", "reasoning-truncated", "sglang")
    assert (cell.status, cell.focus.token_prefix.prev_len) == ("holds", 1089)
    assert cell.renderer == ("sglang 0.5.23 deepseek-recipe (real code) "
                             "(sglang/srt/entrypoints/openai/serving_deepseek_recipe.py)")
    assert cell.request_side == ("sglang 0.5.23 real code (sglang/srt/entrypoints/openai/chat_encoding.py:34 (dsv4), "
                                 "chat_encoding_adapters.py:293, serving_deepseek_recipe.py:100 encode_messages)")
    # The recipe is compiled: the cause is the release's call into it, and says that nothing could be undone.
    cause = run_cell("deepseek-v4", "args-serialization", "sglang").cause
    assert (cause.kind, str(cause.location)) == ("args-reserialised",
                                            "sglang/srt/entrypoints/openai/serving_deepseek_recipe.py:144")
    assert cause.proof.startswith("deepseek-recipe is a compiled extension (deepseek_recipe/_native.abi3.so): none "
                                  "of its constructs can be undone")


def test_deepseek_recipe_takes_truncated_arguments_and_refuses_a_call_without_a_result():
    need("sglang@0.5.23")
    from engine.models import load_model
    from engine.render.deepseek_recipe import SglangDeepSeekRecipeRenderer

    renderer = SglangDeepSeekRecipeRenderer(load_model("deepseek-v4").tokenizer)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Sa'}}
    history = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = renderer.render([*history, {"role": "tool", "tool_call_id": "call_1", "content": "fog"}], None).text
    assert '<｜DSML｜parameter name="arguments" string="true">{"city": "Sa</｜DSML｜parameter>' in text
    # So the tool-call-truncated cell is the server's 400 for the scenario's client (a user turn after the cut
    # call), not our request side's JSON check, which no longer runs for a model the engine renders itself.
    cell = run_cell("deepseek-v4", "tool-call-truncated", "sglang")
    assert cell.status == "error"
    assert cell.note == ("deepseek-v4: sglang 0.5.23 refuses the request: An assistant message with 'tool_calls' must "
                         "be followed by tool messages responding to each 'tool_call_id'. (insufficient tool messages "
                         "following tool_calls message)")


def test_sglang_renders_deepseek_v3_2_with_its_bundled_encoder():
    need("sglang@0.5.23", "sglang@0.5.6", "sglang@0.5.5.post3")
    cell = run_cell("deepseek-v3.2", "args-serialization", "sglang")
    assert cell.renderer == "sglang 0.5.23 encoder (sglang/srt/entrypoints/openai/encoding_dsv32.py)"
    assert (cell.focus.token_prefix.prev_len, cell.focus.token_prefix.common) == (1250, 1208)
    # The construct counterfactuals run in the worker over the release's encoder: its to_json re-dumps the values.
    assert (cell.cause.kind, str(cell.cause.location)) == ("args-reserialised",
                                                      "sglang/srt/entrypoints/openai/encoding_dsv32.py:112")
    assert cell.cause.proof.startswith("re-rendered with to_json(v) printing the model's own text")
    # The encoder writes `</think>` alone in chat mode, in the generation prompt and in the history alike (the Hub's
    # Jinja port writes `<think></think>` before the answer and `</think>` after it, and breaks).
    assert run_cell("deepseek-v3.2", "tool-call", "sglang").status == "holds"
    assert run_cell("deepseek-v3.2", "tool-call", "raw").status == "breaks"
    # 0.5.6-0.5.11 choose the encoder by architecture (no chat template), through serving_chat.py's own check.
    old = run_cell("deepseek-v3.2", "args-serialization", "sglang@0.5.6")
    assert (old.status, str(old.cause.location)) == ("breaks", "sglang/srt/entrypoints/openai/encoding_dsv32.py:102")
    assert run_cell("deepseek-v3.2", "tool-call", "sglang@0.5.5.post3").status == "unavailable"


def test_sglang_splits_deepseek_v3_reasoning_only_for_a_thinking_request():
    """_DeepSeekV3Detector's explicit_thinking: V3.2 with thinking off gets its calls back, as the release's own code
    returns them (the emulation against sglang@0.5.23 run in its worker)."""
    need("sglang@0.5.23")
    from engine.serving.real.backend import RealEngine
    from engine.serving.registry import get_engine

    text = ('\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
            'string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    names = {"reasoning_parser": "deepseek-v3", "tool_parser": "deepseekv32", "tools": tools,
             "chat_template_kwargs": {"thinking": False}}
    emulated = get_engine("sglang").parse(text, **names)
    real = RealEngine("sglang", "0.5.23").parse(text, **names, force_reasoning=False)
    assert [(c.name, c.arguments) for c in emulated.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert (emulated.reasoning, [(c.name, c.arguments) for c in real.tool_calls], real.reasoning) == (
        None, [("get_weather", '{"city": "Paris"}')], None)
    # Thinking on, the reasoning is forced open and the block stays inside it, in both.
    thinking = {**names, "chat_template_kwargs": {"thinking": True}}
    emulated, real = get_engine("sglang").parse(text, **thinking), RealEngine("sglang", "0.5.23").parse(
        text, **thinking, force_reasoning=True)
    assert (emulated.tool_calls, emulated.reasoning) == ((), text) == (real.tool_calls, real.reasoning)
