"""The PRR simulator on real templates, tokenizers and (for Qwen) golden-proven parser emulations.

Findings pinned here are the seed article's DriftMatrix rows where the code at these versions agrees with it; where
it does not, the test follows the code (see docs/FINDINGS.md).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from engine.errors import ExplorerError
from engine.matrix import cell_json
from engine.models import default_model_ids, load_model, load_spec
from engine.scenario import load_scenario, preamble_library, scenario_from_data, scenario_ids
from engine.simulate import run_cell, run_cell_with


@pytest.mark.parametrize("model_id", default_model_ids())
@pytest.mark.parametrize("scenario_id", scenario_ids())
def test_bridge_always_holds(model_id: str, scenario_id: str) -> None:
    # The bridge never renders history, so it holds wherever the new messages render: in every default cell, or the
    # cell is unavailable with its one sentence; never an error.
    cell = run_cell(model_id, scenario_id, "bridge")
    if cell.status == "unavailable":
        if "writes no reasoning here" in cell.note:  # the scenario varies reasoning a model writes none of (Qwen2.5)
            assert load_spec(model_id).reasoning != "always"
        else:  # the template refuses the new messages themselves
            assert cell.note.startswith("the bridge cannot append the new messages (")
        return
    assert cell.status == "holds", cell.note
    assert all(b.string_prefix.holds for b in cell.boundaries)
    assert all(b.token_prefix is None or b.token_prefix.holds for b in cell.boundaries)


def test_the_bridge_holds_where_the_template_cannot_render_the_history() -> None:
    # GPT-OSS's template raises at line 314 on the reasoning-only truncated turn (no content), so every re-rendering
    # column is an error; the bridge renders only the new user message after a synthetic closed turn.
    assert run_cell("gpt-oss", "reasoning-truncated", "raw").note == (
        "openai-gpt-oss-120b.jinja for model gpt-oss raised at line 314: 'dict object' has no attribute 'content'")
    cell = run_cell("gpt-oss", "reasoning-truncated", "bridge")
    assert cell.status == "holds"
    assert cell.note == ("append-only: the previous ids kept, the new messages rendered by openai-gpt-oss-120b.jinja "
                         "after a synthetic closed turn, as the client sent them")
    (boundary,) = cell.boundaries
    assert boundary.string_prefix.to_json() == {"prev_len": 3861, "common": 3861, "holds": True}
    assert boundary.token_prefix.to_json() == {"prev_len": 840, "common": 840, "holds": True}
    # The close is synthesised as the template closes a turn in history, then the new message and the opener.
    assert boundary.next_prompt.text[len(boundary.prev_text):] == (
        "<|end|><|start|>user<|message|>Please continue.<|end|><|start|>assistant")
    assert (boundary.reused_tokens, boundary.prefill_tokens) == (840, 10)


def test_the_bridge_renders_after_another_synthetic_turn_where_the_template_refuses_the_calls() -> None:
    # Llama 3.1's template takes one call a turn (line 71): the two results render after each call alone, alike.
    llama = run_cell("llama-3.1", "parallel-tool-calls", "bridge")
    assert run_cell("llama-3.1", "parallel-tool-calls", "raw").status == "error"
    assert llama.status == "holds"
    assert "; at request 2 its synthetic turn carries each call alone, the template refusing the turn's calls: " \
           "meta-llama-Llama-3.1-8B-Instruct.jinja for model llama-3.1 raised at line 71: This model only supports " \
           "single tool-calls at once!" in llama.note
    (boundary,) = llama.boundaries
    assert boundary.next_prompt.text[len(boundary.prev_text):] == (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|><|start_header_id|>ipython<|end_header_id|>'
        '\n\n"rain"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n')
    # Mistral's template takes no user message right after calls (line 52): the user message follows a turn without
    # calls (the truncated call's close written as the template writes it).
    mistral = run_cell("mistral-small-3.2", "tool-call-truncated", "bridge")
    assert mistral.status == "holds"
    assert "its synthetic turn carries no calls, the template refusing the turn's calls: " in mistral.note
    appended = mistral.boundaries[0].next_prompt.text[len(mistral.boundaries[0].prev_text):]
    assert appended.startswith("</s>[AVAILABLE_TOOLS]") and appended.endswith("[INST]Please continue.[/INST]")


def test_the_bridge_is_unavailable_where_the_template_refuses_the_new_messages() -> None:
    # tool-call-id sends Kimi-style ids back; Mistral's template refuses them in the tool result itself (line 118).
    cell = run_cell("mistral-small-3.2", "tool-call-id", "bridge")
    assert (cell.status, cell.note) == ("unavailable", (
        "the bridge cannot append the new messages (tool): Mistral-Small-3.2-24B-Instruct-2506.jinja for model "
        "mistral-small-3.2 raised at line 118: Tool call IDs should be alphanumeric strings with length 9!"))


def test_the_bridge_adds_what_the_engine_does_not_return_and_nothing_twice() -> None:
    # Qwen: the newline the template writes after <|im_end|> (the engine stops at <|im_end|> and returns no newline).
    qwen = run_cell("qwen3.6", "next-user-turn", "bridge").boundaries[-1]
    assert qwen.completion.text.endswith("<|im_end|>")
    assert qwen.next_prompt.text[len(qwen.prev_text):] == (
        "\n<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    # GLM: the model's stop token is the next message's opener, so it is not written again.
    glm = run_cell("glm-5.1", "next-user-turn", "bridge").boundaries
    assert [b.completion.stop_token for b in glm] == ["<|observation|>", "<|user|>"]
    assert [b.next_prompt.text[len(b.prev_text):] for b in glm] == [
        "<tool_response>sunny, 21°C</tool_response><|assistant|><think>", "And tomorrow?<|assistant|><think>"]
    # Provenance: the appended characters belong to the new user message (system, user, assistant, tool, assistant,
    # user: index 5) or to the template's scaffolding, and the template lines are the real template's.
    last = glm[-1]
    assert set(last.next_prompt.message_index[len(last.prev_text):]) == {-1, 5}
    assert last.next_prompt.source_path == "zai-org-GLM-5.1.jinja"
    assert 0 not in last.next_prompt.source_line[len(last.prev_text):]


def test_the_bridge_refuses_to_render_an_assistant_message_again() -> None:
    from engine.errors import RenderError
    from engine.serving.bridge import bridge_prompt

    model = load_model("qwen3.6")
    boundary = run_cell("qwen3.6", "tool-call", "bridge").boundaries[0]
    with pytest.raises(RenderError, match="the bridge appends only user and tool messages"):
        bridge_prompt(model, boundary.prev_prompt, boundary.completion, {"role": "assistant", "content": "x"},
                       [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "sampled"}], 2,
                       lambda messages: model.renderer.render(messages, None, add_generation_prompt=True, kwargs={}))


@pytest.mark.parametrize(("model_id", "kwarg", "value"), [
    ("qwen3.6", "preserve_thinking", True),
    ("glm-5.1", "clear_thinking", False),
    ("kimi-k2.6", "preserve_thinking", True),
])
def test_history_reasoning_is_dropped_and_the_kwarg_fixes_it(model_id: str, kwarg: str, value: bool) -> None:
    cell = run_cell(model_id, "no-tools-next-user", "raw")
    assert cell.status == "breaks"
    assert cell.cause.stage == "template"
    setting = f"{kwarg}={'true' if value else 'false'}"
    assert cell.cause.fix.to_json() == {
        "kind": "kwarg", "kwarg": kwarg, "value": value, "text": f"set {setting}", "changes_behaviour": False,
        "proof": f"re-run with {setting}: the boundary holds; the prompt the model answered is unchanged"}
    assert run_cell(model_id, "no-tools-next-user", "raw", {kwarg: value}).status == "holds"


def test_qwen_history_reasoning_break_points_at_the_branch_that_drops_it() -> None:
    # The condition at 100 decides; its else-branch at 103 emits the turn without <think>. Flipped for the broken
    # message, the boundary holds.
    cell = run_cell("qwen3.6", "no-tools-next-user", "vllm")
    assert str(cell.cause.location) == "Qwen-Qwen3.6-35B-A3B.jinja:100-103"
    assert cell.cause.kind == "reasoning-dropped"
    assert cell.cause.locations[0].text == ("{% if (preserve_thinking is defined and preserve_thinking is true) or "
                                            "loop.index0 > ns.last_query_index %} (line 100)")
    assert cell.cause.proof.endswith("undone from the broken message on (and the engine's result replaced by the "
                                     "model's fields as written): the boundary holds (3263/3263 characters)")


def test_deepseek_keeps_history_reasoning_when_tools_are_present() -> None:
    # The encoder disables drop_thinking when any message carries tools (encoding_dsv4.py); without tools it drops.
    assert run_cell("deepseek-v4", "next-user-turn", "raw").status == "holds"
    assert run_cell("deepseek-v4", "no-tools-next-user", "raw").status == "breaks"


@pytest.mark.parametrize("model_id", ["qwen3.6", "qwen3.5"])
def test_qwen_template_trims_reasoning_whitespace(model_id: str) -> None:
    # The trim at line 99 changes the model's reasoning; line 101 emits it between its own newlines.
    cell = run_cell(model_id, "reasoning-whitespace", "raw")
    assert cell.status == "breaks"
    assert (cell.cause.kind, [str(loc) for loc in cell.cause.locations]) == (
        "reasoning-trimmed", [f"{cell.cause.locations[0].path}:99", f"{cell.cause.locations[0].path}:101"])
    assert cell.cause.line_text == "reasoning_content|trim"
    assert "reasoning_content + '\\n</think>\\n\\n'" in cell.cause.locations[1].text


def test_qwen_parsers_rewrite_arguments_but_raw_keeps_them() -> None:
    assert run_cell("qwen3.6", "args-serialization", "raw").status == "holds"
    # The model wrote 1.0; vLLM's schema coercion returned 1 (parser_engine.py:437-462). The newline trims around each
    # parameter (vllm/parser/qwen3.py:61-67), undone alone, leave the break where it is.
    vllm = run_cell("qwen3.6", "args-serialization", "vllm")
    assert vllm.status == "breaks" and vllm.cause.stage == "parser"
    assert (vllm.cause.kind, str(vllm.cause.location), vllm.cause.edit.step) == (
        "args-type-coerced", "vllm/parser/engine/parser_engine.py:437-462", "args_schema_coerce")
    assert '"min_score": "1.0"' in vllm.cause.edit.before and '"min_score": 1,' in vllm.cause.edit.after
    assert vllm.cause.proof == ("re-run with args_schema_coerce undone (vllm/parser/engine/parser_engine.py:437-462): "
                                "the boundary holds (5010/5010 characters)")
    sglang = run_cell("qwen3.6", "args-serialization", "sglang")
    assert str(sglang.cause.location) == "sglang/srt/function_call/qwen3_coder_detector.py:229"


def test_tool_call_round_holds_for_qwen_on_both_engines() -> None:
    for engine in ("vllm", "sglang", "raw"):
        cell = run_cell("qwen3.6", "tool-call", engine)
        assert cell.status == "holds", engine
        assert cell.focus.token_prefix.holds


def test_noncanonical_tokens_break_tokens_not_strings() -> None:
    cell = run_cell("qwen3.6", "noncanonical-tokens", "raw")
    assert cell.status == "breaks"
    boundary = cell.focus
    assert boundary.string_prefix.holds and not boundary.token_prefix.holds
    assert cell.cause.stage == "tokenizer"


def test_kimi_is_string_level_and_says_why() -> None:
    cell = cell_json(run_cell("kimi-k2.6", "tool-call", "raw"))
    assert cell["token_prefix"] is None
    assert cell["status"] == "holds"
    assert cell["note"].startswith("tokenizer unavailable for kimi-k2.6")


def test_unemulated_parser_runs_the_releases_real_code() -> None:
    # A server started with the legacy `--tool-call-parser deepseek_v3` for DeepSeek-V4: vLLM has it, the project
    # does not emulate that JSON-in-special-tokens format, so vLLM 0.33.0's own code parses
    # (engine.serving.registry.for_parsers and the NotImplementedError fallback in simulate): it finds no V3 call, the
    # DSML markup stays in the content and the client gets no tool call; the encoder prints the content back as it
    # was, so the prefix holds.
    from test_real_engines import need

    need("vllm@0.33.0")
    model = load_model("deepseek-v4")
    parsers = {**model.spec.engine_parsers, "vllm": {"reasoning_parser": "deepseek_v4",
                                                      "tool_call_parser": "deepseek_v3"}}
    legacy = dataclasses.replace(model, spec=dataclasses.replace(model.spec, engine_parsers=parsers))
    cell = run_cell_with(legacy, "tool-call", "vllm", {})
    assert (cell.status, cell.engine_version) == ("holds", "0.33.0")
    parsed = cell.boundaries[0].parse
    assert parsed.tool_calls == () and parsed.content.startswith("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=")


def test_every_template_cause_names_a_real_line() -> None:
    for model_id in default_model_ids():
        lines = load_model(model_id).renderer.source_lines()
        for scenario_id in scenario_ids():
            cell = run_cell(model_id, scenario_id, "raw")
            if cell.cause and cell.cause.stage == "template":
                for location in cell.cause.locations:
                    assert 0 < location.line <= (location.end_line or location.line) <= len(lines), (
                        model_id, scenario_id)
                # Where no construct undone moves the break, the cause is the emitting line, quoted as it stands.
                if cell.cause.proof.startswith("no construct"):
                    emitted = cell.cause.locations[0]
                    assert lines[emitted.line - 1].strip() == emitted.text, (model_id, scenario_id)


def _golden_locations(engine: str, family: str) -> set[str]:
    """Every edit location the emulation reports on the golden cases the real parser produced."""
    from pathlib import Path

    from engine.serving.registry import get_engine

    emulation = get_engine(engine)
    data = json.loads((Path("tests/golden") / emulation.spec / f"{family}.json").read_text(encoding="utf-8"))
    seen = set()
    for case in data["cases"]:
        try:
            result = emulation.parse(case["text"], reasoning_parser=case["reasoning_parser"],
                                     tool_parser=case["tool_parser"], tools=data.get("tools"),
                                     stream=case["mode"] == "st", chunks=case.get("chunks"))
        except NotImplementedError:
            continue
        seen |= {f"{e.location.path}:{e.location.line}" + (f"-{e.location.end_line}" if e.location.end_line and
                 e.location.end_line != e.location.line else "") for e in result.edits}
    return seen


def test_every_engine_cause_location_is_exercised_by_golden_cases() -> None:
    locations = {engine: _golden_locations(engine, "qwen3") for engine in ("vllm", "sglang")}
    checked = 0
    for model_id in ("qwen3.6", "qwen3.5"):
        for scenario_id in scenario_ids():
            for engine in ("vllm", "sglang"):
                cell = run_cell(model_id, scenario_id, engine)
                if cell.cause and cell.cause.stage == "parser":
                    assert str(cell.cause.location) in locations[engine], cell.cause.location
                    checked += 1
    assert checked >= 4


def test_matrix_cli_json_is_deterministic(tmp_path) -> None:
    args = [sys.executable, "-m", "engine", "matrix", "--models", "qwen3.6,kimi-k2.6",
            "--scenarios", "tool-call,next-user-turn", "--engines", "vllm,raw,bridge"]
    first = subprocess.run([*args, "--json", "-"], capture_output=True, text=True, check=True).stdout
    second = subprocess.run([*args, "--json", "-"], capture_output=True, text=True, check=True).stdout
    assert first == second
    data = json.loads(first)
    assert len(data["cells"]) == 2 * 2 * 3
    keys = {"model", "scenario", "engine", "engine_version", "kwargs", "status", "string_prefix", "token_prefix",
            "reused_tokens", "prefill_tokens", "cause", "boundaries"}
    assert all(keys <= set(c) for c in data["cells"])


def test_every_scenario_starts_with_the_coding_agent_preamble() -> None:
    preamble = preamble_library()["coding-agent"]
    for scenario_id in scenario_ids():
        scenario = load_scenario(scenario_id)
        assert scenario.preamble == "coding-agent" and scenario.system == preamble
        first = run_cell("qwen3.6", scenario_id, "raw").boundaries[0].prev_prompt.text
        assert preamble.strip() in first


def test_an_unknown_preamble_names_the_scenario_file() -> None:
    raw = {"id": "x", "preamble": "chatty", "turns": [{"user": "hi"}]}
    with pytest.raises(ExplorerError, match=r"^scenario scenarios/x.yaml is malformed: unknown preamble 'chatty' "
                                            r"\(known: coding-agent\)$"):
        scenario_from_data(raw, "scenarios/x.yaml")


def test_a_model_writes_reasoning_only_where_it_thinks() -> None:
    # reasoning = "never" (Qwen2.5) or "prompt" (DeepSeek V3.1: only after a prompt that opens <think>).
    plain = run_cell("qwen2.5", "tool-call", "raw").boundaries[0].completion.text
    assert plain.startswith("<tool_call>\n{\"name\": \"get_weather\"") and "</think>" not in plain
    off = run_cell("deepseek-v3.1", "tool-call", "raw")
    assert off.boundaries[0].prev_prompt.text.endswith("<｜Assistant｜><think></think>")
    assert off.boundaries[0].completion.text.startswith("<｜tool▁calls▁begin｜>")
    on = run_cell("deepseek-v3.1", "tool-call", "raw", {"thinking": True})
    assert on.boundaries[0].prev_prompt.text.endswith("<｜Assistant｜><think>")
    assert on.boundaries[0].completion.text.startswith(
        "The user wants today's weather in Paris. I should call get_weather.</think><｜tool▁calls▁begin｜>")
    cell = run_cell("qwen2.5", "reasoning-truncated", "vllm")
    assert (cell.status, cell.note) == ("unavailable", "qwen2.5 writes no reasoning here (it does not think), and this "
                                        "scenario varies the reasoning (truncate_in=reasoning)")
