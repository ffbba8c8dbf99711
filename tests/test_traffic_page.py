"""The "Your traffic" page through AppTest, and the trace store behind its upload (validated, atomic, by content)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import APP_RUN_BOUND_S
from streamlit.testing.v1 import AppTest

from engine.errors import ExplorerError
from engine.models import default_model_ids
from engine.traces.records import TraceFormatError
from engine.traces.report import analyse_trace
from engine.traces.store import TraceLimits, TraceStore

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
SAMPLES = ROOT / "samples" / "traces"


def test_store_keeps_a_trace_once_by_content(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    data = (SAMPLES / "vllm-0.33.0.log").read_bytes()
    stored = store.add("server.log", data)
    assert (stored.format, stored.requests, stored.sessions) == ("vllm-log", 11, 5)
    assert stored.path.read_bytes() == data
    again = store.add("renamed.log", data)
    assert again.id == stored.id and again.name == "server.log"
    assert [t.id for t in store.list()[0]] == [stored.id]
    store.remove(stored.id)
    assert store.list() == ([], [])


def test_store_keeps_the_good_records_of_a_trace_and_names_the_bad_one(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    data = (SAMPLES / "malformed" / "openai.jsonl").read_bytes()  # two good lines, then one without a choice
    stored = store.add("bad.jsonl", data)
    assert (stored.requests, stored.sessions, stored.skipped_count) == (2, 2, 1)
    assert stored.skipped == ("bad.jsonl: line 3: response.choices is empty or not a list",)
    assert stored.path.read_bytes() == data  # stored as uploaded: the analysis leaves the bad record out again
    assert store.list()[0] == [stored]
    report = analyse_trace(stored.path, None, name=stored.name, skip_bad_records=True)
    assert (report.requests, report.skipped_count) == (2, 1)
    assert report.skipped_sentence == ("bad.jsonl: line 3: response.choices is empty or not a list (that record was "
                                       "skipped, the rest of the file was read)")


def test_store_refuses_a_trace_without_a_good_record_and_leaves_nothing(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    bad = (SAMPLES / "malformed" / "openai.jsonl").read_bytes().splitlines(keepends=True)[2]
    with pytest.raises(TraceFormatError) as caught:
        store.add("bad.jsonl", bad)
    assert str(caught.value) == ("bad.jsonl: line 1: response.choices is empty or not a list (that record was skipped, "
                                 "no other record is a complete request)")
    assert list(store.root.iterdir()) == []
    with pytest.raises(TraceFormatError, match="larger than the 0 MB limit for traces"):
        TraceStore(tmp_path, TraceLimits(max_bytes=10)).add("big.log", b"x" * 11)


def test_ten_thousand_bad_records_are_counted_not_kept(tmp_path: Path) -> None:
    first, second = (SAMPLES / "openai.jsonl").read_bytes().splitlines(keepends=True)[:2]
    stored = TraceStore(tmp_path).add("many.jsonl", first + b"{}\n" * 10_000 + second)
    assert (stored.requests, stored.skipped_count) == (2, 10_000)
    assert stored.skipped == tuple(f"many.jsonl: line {n}: each line needs a request object and a response object"
                                   for n in range(2, 7))
    report = analyse_trace(stored.path, None, name=stored.name, skip_bad_records=True)
    assert (len(report.skipped), report.skipped_count, report.requests) == (100, 10_000, 2)
    assert report.skipped_sentence == (
        "many.jsonl: line 2: each line needs a request object and a response object (10000 bad records were skipped: "
        "this one and line 3, line 4, line 5, line 6, …; the rest of the file was read)")


def test_store_reports_an_interrupted_upload(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    stored = store.add("a.jsonl", (SAMPLES / "openai.jsonl").read_bytes())
    (store.root / ".tmp-0123456789abcdef-x").mkdir()
    (store.root / "ffffffffffffffff").mkdir()  # no meta.json: damaged
    traces, skipped = store.list()
    assert [t.id for t in traces] == [stored.id]
    assert len(skipped) == 2 and "interrupted" in skipped[0] and "damaged" in skipped[1]
    with pytest.raises(ExplorerError, match="no stored trace"):
        store.remove("nothing")


@pytest.fixture
def traffic(tmp_path, monkeypatch) -> AppTest:
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    TraceStore(tmp_path / "workspace").add("sglang-0.5.23.log", (SAMPLES / "sglang-0.5.23.log").read_bytes())
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.run()
    at.switch_page("pages/traffic.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_traffic_page_sessions_and_a_break(traffic: AppTest) -> None:
    assert traffic.title[0].value == "Your traffic"
    traffic.selectbox(key="traffic:engine").set_value("sglang@0.5.23").run()
    assert not traffic.exception, [e.value for e in traffic.exception]
    sessions = traffic.dataframe(key="traffic:sessions").value
    assert list(sessions["requests"]) == [2, 3, 2, 2, 2]
    assert list(sessions["cache lost (tokens)"]) == [0, 90, 88, 45, 36]
    requests = traffic.dataframe(key="traffic:requests:2").value
    assert list(requests["prefill"]) == [1021, 22, 72]  # SGLang dumps the tool with "defer_loading": null
    assert list(requests["cause"]) == ["", "", "reproduced: select it"]  # attributed when opened
    traffic.session_state["traffic:requests:2"] = {"selection": {"rows": [2], "columns": [], "cells": []}}
    traffic.run()
    assert not traffic.exception, [e.value for e in traffic.exception]
    traffic.run()  # the cause is kept: the table shows it now
    assert list(traffic.dataframe(key="traffic:requests:2").value["cause"]) == ["", "", "template (reasoning-dropped)"]
    text = " ".join(m.value for m in traffic.markdown)
    assert "**Cause: template** (reasoning-dropped)" in text
    assert "first differing token 1019 ('<think>' → '<tool_call>')" in text


def test_your_conversation_runs_as_a_matrix_row(traffic: AppTest) -> None:
    traffic.button(key="traffic:run_row").click().run()
    assert not traffic.exception, [e.value for e in traffic.exception]
    row = next(d.value for d in traffic.dataframe if "my-conversation" in d.value.index)
    assert list(row.columns) == default_model_ids()
    assert row.loc["my-conversation", "qwen3.5"] == "✗ -85tok"
    assert row.loc["my-conversation", "deepseek-v4"] == "✓"


def test_a_trace_with_bad_records_keeps_the_good_ones_and_names_the_first_five(traffic: AppTest) -> None:
    first, second = (SAMPLES / "openai.jsonl").read_bytes().splitlines(keepends=True)[:2]
    traffic.file_uploader(key="traffic:file").upload("many.jsonl", first + b"{}\n" * 10_000 + second,
                                                     "application/octet-stream")
    next(b for b in traffic.button if b.label == "Store and analyse").click().run()
    assert not traffic.exception and not traffic.error, [e.value for e in [*traffic.exception, *traffic.error]]
    assert [w.value for w in traffic.warning] == [
        "many.jsonl: 10000 bad records left out; its other 2 requests are analysed below.\n\n"
        + "\n".join(f"- many.jsonl: line {n}: each line needs a request object and a response object"
                    for n in range(2, 7))
        + "\n- and 9995 more bad records."]
    assert list(traffic.dataframe(key="traffic:sessions").value["requests"]) == [1, 1]
