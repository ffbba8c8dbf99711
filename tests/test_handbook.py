"""The handbook's agent session (seed 003) through the project's own engine: its exact published figures."""

from __future__ import annotations

from engine.models import load_model
from engine.session import load_session, shared_across_sessions, shared_with_timestamp, simulate_session


def test_handbook_table_is_reproduced() -> None:
    model = load_model("qwen3.5")
    report = simulate_session(model, load_session("handbook"))
    assert [r.prompt_tokens for r in report.rows] == [506, 773, 898, 824]
    assert [r.reusable_tokens for r in report.rows] == [0, 580, 880, 504]
    assert [r.prefill_tokens for r in report.rows] == [506, 193, 18, 320]
    assert [r.decode_tokens for r in report.rows] == [74, 107, 47, None]
    assert [r.hybrid_prefill_tokens for r in report.rows] == [506, 193, 18, 824]
    assert (report.total_prompt_tokens, report.total_prefill_tokens) == (3001, 1037)
    assert report.total_hybrid_prefill_tokens == 1541


def test_handbook_sharing_across_sessions() -> None:
    model = load_model("qwen3.5")
    script = load_session("handbook")
    assert shared_across_sessions(model, script) == 486
    assert shared_with_timestamp(model, script, "start") == 418
    assert shared_with_timestamp(model, script, "end") == 502


def test_handbook_exercise_history_kept() -> None:
    """The exercise: with the history kept, request 4 reuses 945 (= 898 + 47) and prefills 14 of 959 tokens.

    The 0.8B template has no kwarg that keeps earlier reasoning, so the engine keeps the history append-only, as the
    handbook's answer builds it: request 3's whole sequence + the new user message + the generation prompt.
    """
    from engine.session import history_preserving_kwargs, run_what_if

    model, script = load_model("qwen3.5"), load_session("handbook")
    assert history_preserving_kwargs(model, script) is None
    result = run_what_if("history-kept", model, script)
    assert result.after_label == "append-only: no template kwarg keeps the history"
    last = result.requests[3]
    assert (last.prompt_before, last.reusable_before, last.prefill_before) == (824, 504, 320)
    assert (last.prompt_after, last.reusable_after, last.prefill_after) == (959, 945, 14)
    assert [r.index for r in result.changed] == [4]
    assert (result.prefill_before, result.prefill_after) == (1037, 731)
    appended = result.after.rows[3].prompt_render.text[len(result.after.rows[2].sequence_render.text):]
    assert appended == "<|im_start|>user\n那明天呢？<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_handbook_exercise_with_qwen36_preserve_thinking() -> None:
    """Qwen3.6's template is the 0.8B one plus a preserve_thinking switch: found by flipping, same 945 / 14."""
    from engine.session import history_preserving_kwargs, run_what_if

    model, script = load_model("qwen3.6"), load_session("handbook")
    assert history_preserving_kwargs(model, script) == {"preserve_thinking": True}
    result = run_what_if("history-kept", model, script)
    assert result.after_label == "template kwargs preserve_thinking=true"
    last = result.requests[3]
    assert (last.prompt_after, last.reusable_after, last.prefill_after) == (959, 945, 14)
    kept_qwen35 = run_what_if("history-kept", load_model("qwen3.5"), script)
    assert result.after.rows[3].prompt_render.text == kept_qwen35.after.rows[3].prompt_render.text


def test_session_command_reports_the_exercise(capsys) -> None:
    from engine.cli import main

    assert main(["session", "--model", "qwen3.5", "--script", "handbook"]) == 0
    out = capsys.readouterr().out
    assert "total prompt 3001 -> prefill 1037 (block 16: 1049, hybrid: 1541); decode 228" in out
    assert ("history kept (append-only: no template kwarg keeps the history): request 4 prompt 959, reuses 945, "
            "prefills 14 (as rendered: 824, 504, 320)") in out
    assert "request 4 breaks at token 504 of request 3's 945-token sequence (char 1767):" in out
