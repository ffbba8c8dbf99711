"""The handbook session through an engine (`session --engine`): replies written as model output, parsed, sent back.

Template-only (tests/test_handbook.py) the handbook's figures are: prompts 506, 773, 898, 824; reusable 0, 580,
880, 504; decode 74, 107, 47; total prefill 1037 (block 16: 1049, hybrid: 1541), decode 228.

Through raw, vLLM 0.33.0 and SGLang 0.5.23 alike (measured once), with Qwen3.5's real template and tokenizer:
the prompts are the same, but each reply's sequence is the prompt plus the tokens of what the model writes.
Qwen3.5 writes `reasoning\\n</think>\\n\\n` after the prompt's `<think>\\n`, then the tool call (or the answer),
then `<|im_end|>`, and stops: byte for byte what the template renders for the latest turn, except the `\\n` the
template adds after `<|im_end|>`. So each decode is one token less (73, 106, 46: 225), requests 2 and 3 reuse
one token less and prefill that newline instead (579, 879; prefill 194, 19: total 1039, hybrid 1543), and block
reuse of request 3 drops a whole 16-token block (880 was exactly 55 blocks, 879 is 54: 864, block prefill 1065).
Request 4 still reuses 504: the template drops the earlier replies' reasoning once a new user message arrives.
The parsers do edit the replies (vLLM strips the `\\n\\n` content before the tool call, SGLang re-dumps the
arguments as JSON), but the template trims content and renders arguments from the mapping, so no prompt changes.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.cli import main
from engine.models import load_model
from engine.session import SessionSettings, break_view, run_what_if, simulate_session

# SGLang hands the template its pydantic dump of the three tools, each with `"defer_loading": null` (6 tokens more
# per tool in every prompt; tests/test_engine_request_side.py proves it against SGLang 0.5.23's own code).
SGLANG_TOOLS = 18


@pytest.mark.parametrize("engine", ["raw", "vllm", "sglang"])
def test_handbook_figures_through_an_engine(qwen35, handbook, engine: str) -> None:
    report = simulate_session(qwen35, handbook, engine=engine)
    extra = SGLANG_TOOLS if engine == "sglang" else 0
    assert [r.prompt_tokens - extra for r in report.rows] == [506, 773, 898, 824]
    assert [r.reusable_tokens - (extra if r.reusable_tokens else 0) for r in report.rows] == [0, 579, 879, 504]
    assert [r.prefill_tokens - (extra if n == 0 else 0) for n, r in enumerate(report.rows)] == [506, 194, 19, 320]
    assert [r.decode_tokens for r in report.rows] == [73, 106, 46, None]
    assert [r.block_reusable_tokens for r in report.rows] == ([0, 592, 896, 512] if extra else [0, 576, 864, 496])
    assert [r.hybrid_prefill_tokens for r in report.rows] == ([524, 194, 19, 842] if extra else [506, 194, 19, 824])
    assert [r.breaks for r in report.rows] == [False, False, False, True]
    assert (report.total_prompt_tokens, report.total_prefill_tokens, report.total_block_prefill_tokens,
            report.total_hybrid_prefill_tokens, report.total_decode_tokens) == (
        (3073, 1057, 1073, 1579, 225) if extra else (3001, 1039, 1065, 1543, 225))
    view = break_view(qwen35, report, 4)
    assert (view.compared_request, view.token_position, view.char_position) == (
        (3, 522, 1836) if extra else (3, 504, 1767))
    assert view.previous_location.line == 101 and view.next_location.line == 114  # reasoning dropped, call kept


def test_raw_sequences_are_prompt_plus_written_completion(qwen35, handbook) -> None:
    raw = simulate_session(qwen35, handbook, engine="raw")
    template = simulate_session(qwen35, handbook)
    for row in raw.rows:
        assert row.sequence_tokenized.ids[:row.prompt_tokens] == row.prompt_tokenized.ids
        assert row.sequence_render.text.startswith(row.prompt_render.text)
    for raw_row, template_row in zip(raw.rows[:3], template.rows[:3]):
        assert raw_row.prompt_render.text == template_row.prompt_render.text
        assert raw_row.sequence_render.text.endswith("<|im_end|>")
        # The only difference from the template's rendering of the reply: the newline after the turn end.
        assert template_row.sequence_render.text == raw_row.sequence_render.text + "\n"


def test_json_names_the_engine_and_the_parser_edits(capsys) -> None:
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--engine", "sglang", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["engine"], data["engine_version"]) == ("sglang", "0.5.23")
    assert [[e["step"] for e in r["parse_edits"]] for r in data["requests"]] == [
        ["param_trim_newline", "args_convert_dump", "content_before_calls"],
        ["param_trim_newline", "args_convert_dump", "content_before_calls"], [], []]
    first = data["requests"][0]["parse_edits"][1]
    assert (first["before"], first["after"]) == ("\n<parameter=query>\n北京 今天 天气 最高气温\n</parameter>\n",
                                                 '{"query": "北京 今天 天气 最高气温"}')
    assert first["location"]["path"] == "sglang/srt/function_call/qwen3_coder_detector.py"
    assert data["totals"]["decode_tokens"] == 225 and data["history_kept"] is None


def test_template_only_json_has_no_engine(capsys) -> None:
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["engine"], data["engine_version"]) == (None, "")
    assert "parse_edits" not in data["requests"][0]


def test_cli_says_how_the_accounting_changes(capsys) -> None:
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--engine", "vllm"]) == 0
    out = capsys.readouterr().out
    assert ("# engine vllm 0.33.0: each reply written as model output and parsed; sequence = prompt + completion "
            "tokens, decode = completion tokens (stop token included)") in out
    assert "total prompt 3001 -> prefill 1039 (block 16: 1065, hybrid: 1543); decode 225" in out
    assert ("request 1 reply: vllm 0.33.0 content_strip at vllm/parser/engine/parser_engine.py:488-498: '\\n\\n' -> "
            "''") in out
    assert "request 4 breaks at token 504 of request 3's 944-token sequence (char 1767):" in out
    assert "history kept" not in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--engine", "bridge"], "error: unknown engine 'bridge' for a session (bridge is history 'append'); known: "
                             "raw, vllm, sglang, vllm@0.33.0, sglang@0.5.23, sglang@0.5.12\n"),
    (["--engine", "vllm", "--history", "append"],
     "error: engine 'vllm' re-renders every request from the parsed messages, so it cannot keep the history "
     "'append'; use history 'template' with an engine\n"),
    (["--engine", "vllm", "--what-if", "history-kept"],
     "error: history kept through engine vllm: no single template kwarg keeps qwen3.5's history, and an append-only "
     "history is built from the template alone; run this what-if without an engine\n"),
])
def test_bad_engine_options_give_one_sentence(capsys, argv: list[str], message: str) -> None:
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", *argv]) == 2
    assert capsys.readouterr().err == message


def test_a_parser_not_emulated_runs_the_releases_real_code(handbook) -> None:
    # A server started with the legacy `--tool-call-parser deepseek_v3` for DeepSeek-V4: vLLM 0.33.0 has that
    # parser, the project does not emulate it (a different format from DSML), so vLLM 0.33.0's own code parses the
    # replies (engine.serving.registry.parse_served): it finds no V3 call and keeps the DSML markup as content, which
    # the encoder prints back as it was, so each request reuses the whole previous sequence.
    from test_real_engines import need

    need("vllm@0.33.0")
    model = load_model("deepseek-v4")
    parsers = {**model.spec.engine_parsers, "vllm": {"reasoning_parser": "deepseek_v4",
                                                      "tool_call_parser": "deepseek_v3"}}
    legacy = dataclasses.replace(model, spec=dataclasses.replace(model.spec, engine_parsers=parsers))
    report = simulate_session(legacy, handbook, engine="vllm")
    assert (report.engine, report.engine_version) == ("vllm", "0.33.0")
    assert [(r.index, r.reusable_tokens, r.previous_sequence_tokens) for r in report.rows] == [
        (1, 0, 0), (2, 665, 665), (3, 969, 969), (4, 1028, 1028)]  # vLLM's encoder: its 79-token preamble


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_what_ifs_through_an_engine(qwen35, handbook, engine: str) -> None:
    # Both sides through the engine: each figure is the template-only one (tests/test_session_what_if.py) less the
    # newline after <|im_end|> that the model never writes, wherever the reuse reached past a reply.
    settings = SessionSettings(engine=engine)
    added = run_what_if("tool-added", qwen35, handbook, settings)
    assert added.engine == {"vllm": "vllm 0.33.0", "sglang": "sglang 0.5.23"}[engine]
    x = SGLANG_TOOLS if engine == "sglang" else 0  # both sides carry SGLang's tool dump: reuse past it grows by x
    y = x + 6 if x else 0  # the added tool's own dump, after the break
    assert [(r.reusable_before, r.reusable_after) for r in added.requests] == [
        (0, 0), (579 + x, 216 + x), (879 + x, 942 + y), (504 + x, 567 + y)]
    assert (added.prefill_before, added.prefill_after) == (1039 + x, 1465 + y)
    reordered = run_what_if("tools-reordered", qwen35, handbook, settings)
    assert [r.reusable_after for r in reordered.requests] == [0, 32, 879 + x, 504 + x]
    summarised = run_what_if("tool-result-summarised", qwen35, handbook, settings)
    assert [(r.prompt_after, r.reusable_after, r.prefill_after) for r in summarised.requests] == [
        (506 + x, 0, 506 + x), (773 + x, 579 + x, 194), (743 + x, 585 + x, 158), (669 + x, 504 + x, 165)]
    kept = run_what_if("history-kept", load_model("qwen3.6"), handbook, settings)
    assert kept.after_label == "template kwargs preserve_thinking=true"
    assert [(r.reusable_before, r.reusable_after) for r in kept.requests][-1] == (504 + x, 944 + x)
    # A first request has no parsed reply before it: the engine changes nothing there.
    assert run_what_if("unrelated-sessions", qwen35, handbook, settings).engine == ""


def test_what_if_cli_through_an_engine(capsys) -> None:
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--what-if", "tool-added",
                 "--engine", "vllm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# what-if tool-added: the script's tool list, unchanged -> from request 2, tool "
                          "'get_weather' appended to the list (both through vllm 0.33.0)\n")
    assert "total reused 1962 -> 1725, prefill 1039 -> 1465" in out
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--what-if", "timestamp-position",
                 "--engine", "vllm"]) == 0
    assert capsys.readouterr().out.startswith(
        "# timestamp-position compares first requests, which no engine changes (nothing parsed yet)\n")


def test_decode_is_the_completion_when_the_template_rewrites_the_history() -> None:
    # GPT-OSS's template drops the earlier analysis turns once a final answer follows, so request 3's sequence is
    # shorter than its prompt (1692 vs 1814 characters); the decode is the reply after `<|start|>assistant`:
    # 52 tokens, not 635 - 709 = -74.
    from engine.models import load_model
    from engine.session import load_session, simulate_session

    model = load_model("gpt-oss")
    report = simulate_session(model, load_session("handbook"))
    assert [r.decode_tokens for r in report.rows] == [76, 103, 52, None]
    completion = ("<|channel|>analysis<|message|>23°C 换算成华氏度是 73.4°F，可以回答了。<|end|><|start|>assistant"
                  "<|channel|>final<|message|>北京今天最高气温约 23°C，换算成华氏度是 73.4°F。<|return|>")
    assert report.rows[2].sequence_render.text.endswith(completion)
    assert len(model.tokenizer.encode(completion).ids) == 52
