"""What-if experiments on the handbook's session (Qwen3.5-0.8B template and tokenizer): exact figures."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.errors import ExplorerError
from engine.session import (
    SessionSettings,
    break_view,
    load_session,
    run_what_if,
    simulate_session,
    what_if_names,
)


def test_registry_names() -> None:
    assert what_if_names() == ["history-kept", "timestamp-position", "tool-added", "tools-reordered",
                               "unrelated-sessions", "tool-result-summarised"]


def test_timestamp_position(qwen35, handbook) -> None:
    result = run_what_if("timestamp-position", qwen35, handbook)
    (request,) = result.requests
    assert (request.reusable_before, request.reusable_after) == (418, 502)
    # 418 = 26*16 + 2 -> 416; 502 = 31*16 + 6 -> 496
    assert (request.block_reusable_before, request.block_reusable_after) == (416, 496)
    assert result.description == (
        "timestamp position: two sessions started seconds apart share 418 tokens with the time at the start of the "
        "system prompt, 502 with it at the end (486 without a timestamp; 416 vs 496 in whole 16-token blocks)")


def test_unrelated_sessions(qwen35, handbook) -> None:
    result = run_what_if("unrelated-sessions", qwen35, handbook)
    (request,) = result.requests
    assert (request.prompt_after, request.reusable_before, request.reusable_after) == (507, 0, 486)
    assert request.block_reusable_after == 480  # 486 = 30*16 + 6
    assert request.hybrid_reusable_after == 0  # the first session's only checkpoint is its prompt end, 506


def test_tool_added(qwen35, handbook) -> None:
    result = run_what_if("tool-added", qwen35, handbook)
    assert [(r.reusable_before, r.reusable_after) for r in result.requests] == [(0, 0), (580, 216), (880, 943),
                                                                               (504, 567)]
    assert [r.index for r in result.changed] == [2]
    assert (result.prefill_before, result.prefill_after) == (1037, 1464)
    # The new tool is appended, so request 2 reuses the whole old tool list and breaks where it used to close.
    view = break_view(qwen35, result.after, 2)
    assert view.token_position == 216
    assert view.previous_text[view.previous_token_char_start:].startswith("</tools>")
    assert view.next_text[view.token_char_start:].startswith('{"type": "function", "function": {"name": "get_weather"')
    assert (view.previous_location.line, view.next_location.line) == (52, 50)


def test_tools_reordered(qwen35, handbook) -> None:
    result = run_what_if("tools-reordered", qwen35, handbook)
    assert [r.reusable_after for r in result.requests] == [0, 32, 880, 504]
    assert (result.prefill_before, result.prefill_after) == (1037, 1585)
    view = break_view(qwen35, result.after, 2)
    assert view.next_text[view.token_char_start:].startswith('read_file"')
    assert view.previous_text[view.previous_token_char_start:].startswith('web_search"')


def test_tool_result_summarised(qwen35, handbook) -> None:
    result = run_what_if("tool-result-summarised", qwen35, handbook)
    assert [(r.prompt_after, r.reusable_after, r.prefill_after) for r in result.requests] == [
        (506, 0, 506), (773, 580, 193), (743, 585, 158), (669, 504, 165)]
    assert [r.index for r in result.changed] == [3, 4]
    # Request 3 breaks inside the summarised tool result (message 3 = step 2, after the system message).
    view = break_view(qwen35, result.after, 3)
    assert (view.token_position, view.next_message_index, view.next_location.line) == (585, 3, 136)
    assert view.next_text[view.token_char_start:].startswith("搜索结果摘要")


def test_settings_reach_the_what_if(qwen35, handbook) -> None:
    result = run_what_if("unrelated-sessions", qwen35, handbook, SessionSettings(block_size=4))
    assert result.requests[0].block_reusable_after == 484  # 486 = 121*4 + 2


def test_bad_what_if_input(qwen35, handbook, tmp_path) -> None:
    with pytest.raises(ExplorerError, match="unknown what-if 'nope'; known: history-kept, "):
        run_what_if("nope", qwen35, handbook)
    raw = json.loads(open(handbook.source, encoding="utf-8").read())
    raw["what_if"]["summary"]["step"] = 1
    bad = tmp_path / "bad-summary.json"
    bad.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ExplorerError, match="no tool result to summarise"):
        run_what_if("tool-result-summarised", qwen35, load_session(str(bad)))
    raw["unrelated_questions"] = ["only one"]
    raw["tools"] = raw["tools"][:1]
    bad.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    script = load_session(str(bad))
    with pytest.raises(ExplorerError, match="needs two unrelated_questions for the cross-session figures, it has 1"):
        run_what_if("unrelated-sessions", qwen35, script)
    with pytest.raises(ExplorerError, match="has 1 tool\\(s\\): nothing to reorder"):
        run_what_if("tools-reordered", qwen35, script)
    raw["unrelated_questions"] = ["a", "b"]
    raw["timestamp"]["template"] = "now: {minute}"
    bad.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ExplorerError, match="timestamp template 'now: {minute}' must use only {second}"):
        run_what_if("timestamp-position", qwen35, load_session(str(bad)))
    with pytest.raises(ExplorerError, match="cannot take rewrites"):
        from engine.session import ToolsChange

        simulate_session(qwen35, handbook, history="append", rewrites=(ToolsChange(2, ()),))


def test_cli_what_if(capsys) -> None:
    assert main(["session", "--what-if", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == what_if_names()
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--what-if", "timestamp-position",
                 "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"][0]["reusable_before"] == 418 and data["requests"][0]["reusable_after"] == 502
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--what-if", "history-kept"]) == 0
    out = capsys.readouterr().out
    assert "  4    824 -> 959    504 -> 945     320 -> 14    496 -> 944      0 -> 945" in out
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--history", "append"]) == 0
    out = capsys.readouterr().out
    assert "  4 next user      959     945       14       …       944          14" in out
    assert "breaks at" not in out and "history kept" not in out
    assert main(["session", "--what-if", "tool-added"]) == 2
    assert capsys.readouterr().err == ("error: session needs --model and --script (only --what-if list runs without "
                                       "them)\n")
