"""Per-request data for the session page: counts under each accounting, and the break view of a request."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.errors import ExplorerError
from engine.models import load_model
from engine.session import break_view, load_session, simulate_session


@pytest.fixture(scope="module")
def report():
    return simulate_session(load_model("qwen3.5"), load_session("handbook"))


def test_counts_per_accounting(report) -> None:
    last = report.rows[3]
    assert last.counts("token").__dict__ == {"prompt_tokens": 824, "reusable_tokens": 504, "prefill_tokens": 320,
                                             "decode_tokens": None}
    assert (last.counts("block").reusable_tokens, last.counts("block").prefill_tokens) == (496, 328)
    assert (last.counts("hybrid").reusable_tokens, last.counts("hybrid").prefill_tokens) == (0, 824)
    assert report.totals("token").__dict__ == {"prompt_tokens": 3001, "reusable_tokens": 1964,
                                               "prefill_tokens": 1037, "decode_tokens": 228}
    assert report.totals("hybrid").prefill_tokens == 1541
    with pytest.raises(ExplorerError, match="unknown accounting 'paged'; known: token, block, hybrid"):
        last.counts("paged")


def test_only_the_next_user_request_breaks(report) -> None:
    assert [r.breaks for r in report.rows] == [False, False, False, True]
    assert [r.previous_sequence_tokens for r in report.rows] == [0, 580, 880, 945]
    assert [r.matched_request for r in report.rows] == [0, 1, 2, 3]
    model = load_model("qwen3.5")
    assert [break_view(model, report, i) for i in (1, 2, 3)] == [None, None, None]
    with pytest.raises(ExplorerError, match="session handbook has requests 1..4, not 5"):
        break_view(model, report, 5)


def test_break_view_of_the_next_user_request(report) -> None:
    """The template drops request 1's reasoning: <think> (line 101) in the sequence, <tool_call> (line 114) next."""
    view = break_view(load_model("qwen3.5"), report, 4)
    assert (view.request, view.compared_request) == (4, 3)
    assert (len(view.previous_ids), len(view.next_ids)) == (945, 824)
    assert view.previous_ids == report.rows[2].sequence_tokenized.ids
    assert view.next_text == report.rows[3].prompt_render.text
    assert (view.token_position, view.char_position, view.token_char_start) == (504, 1767, 1765)
    assert view.previous_text[1765:1772] == "<think>" and view.next_text[1765:1776] == "<tool_call>"
    assert not view.token_only
    assert (view.previous_location.line, view.next_location.line) == (101, 114)
    assert view.next_location.path == "Qwen-Qwen3.5-0.8B.jinja"
    assert view.next_location.text == "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    assert (view.previous_message_index, view.next_message_index) == (2, 2)  # the first assistant reply


def test_session_json_keeps_its_keys_and_adds_the_break(capsys) -> None:
    assert main(["session", "--model", "qwen3.5", "--script", "handbook", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["requests"][0]) >= {"index", "trigger", "prompt_tokens", "reusable_tokens", "prefill_tokens",
                                        "decode_tokens", "block_reusable_tokens", "hybrid_reusable_tokens",
                                        "sequence_tokens", "block_prefill_tokens", "hybrid_prefill_tokens"}
    assert data["totals"] == {"prompt_tokens": 3001, "prefill_tokens": 1037, "block_prefill_tokens": 1049,
                              "hybrid_prefill_tokens": 1541, "decode_tokens": 228}
    assert (data["shared_unrelated_sessions"], data["shared_timestamp_start"], data["shared_timestamp_end"]) == \
        (486, 418, 502)
    (brk,) = data["breaks"]
    assert (brk["request"], brk["token_position"], brk["next_location"]["line"]) == (4, 504, 114)
    assert data["history_kept"]["requests"][3]["reusable_after"] == 945


def test_bad_session_scripts(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": [{"role": "user", "content": "hi"}, {"content": "no role"}]}))
    with pytest.raises(ExplorerError, match=f"session script {bad}: step 1 must be a message whose role is one of "):
        load_session(str(bad))
    bad.write_text("{not json")
    with pytest.raises(ExplorerError, match=f"session script {bad} is malformed"):
        load_session(str(bad))
    bad.write_text(json.dumps({"steps": [{"role": "assistant", "content": "only a reply"}]}))
    with pytest.raises(ExplorerError, match="has no user or tool message, so it makes no request"):
        load_session(str(bad))
    with pytest.raises(ExplorerError, match="no session script 'nope': not a file, and not one of handbook"):
        load_session("nope")
