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
