"""The "Live watch" page through AppTest, on a watch folder written by the watch's own analysis (LiveAnalysis over
the openai-jsonl sample, as the analysis process writes live.json, and the proxy's status.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import APP_RUN_BOUND_S
from streamlit.testing.v1 import AppTest

from engine.watch.live import LIVE_NAME, STATUS_NAME, LiveAnalysis, read_watch, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
SAMPLE = ROOT / "samples" / "traces" / "openai.jsonl"


@pytest.fixture(scope="module")
def folder(tmp_path_factory, qwen35) -> Path:
    out = tmp_path_factory.mktemp("watch")
    shutil.copy(SAMPLE, out / "records.jsonl")
    live = LiveAnalysis(qwen35, "vllm@0.33.0", 16, "records.jsonl")
    lines = SAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
    for n, line in enumerate(lines, start=1):
        assert live.add_line(n, line)["type"] == "span"
    write_json_atomic(out / LIVE_NAME, live.state())
    write_json_atomic(out / STATUS_NAME, {"format": "drift-watch-status/1", "model": "qwen3.5",
                                          "engine": "vllm@0.33.0", "block_size": 16, "recorded": len(lines),
                                          "dropped": 0, "analysis": "ready", "upstream": "http://127.0.0.1:1/v1"})
    return out


def test_the_snapshot_lists_every_break_in_record_order(folder) -> None:
    snapshot = read_watch(folder)
    assert [(b["key"], b["index"], b["cause"]["kind"]) for b in snapshot.breaks()] == [
        ("noncanonical-tokens-5", 2, "retokenised"), ("client-drops-reasoning-4", 2, "client-dropped-field"),
        ("args-serialization-3", 2, "args-type-coerced"), ("next-user-turn-2", 3, "reasoning-dropped")]
    assert json.loads((folder / LIVE_NAME).read_text())["analysed"] == 11


def test_a_folder_without_a_watch_is_one_sentence(tmp_path) -> None:
    from engine.errors import ExplorerError

    with pytest.raises(ExplorerError, match="holds no watch state"):
        read_watch(tmp_path)


def test_the_live_page_shows_sessions_breaks_and_a_break_view(folder) -> None:
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.run()
    at.switch_page("pages/watch.py").run()
    at.text_input(key="watch:folder").set_value(str(folder)).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Live watch"
    assert [m.value for m in at.metric] == ["11", "11", "0", "5", "4"]
    sessions = at.dataframe[0].value
    assert list(sessions["requests"]) == [2, 2, 2, 3, 2]
    assert list(sessions["cache lost (tokens)"]) == [36, 45, 88, 90, 0]
    breaks = at.dataframe(key="watch:breaks").value
    assert list(breaks["cause"]) == ["tokenizer (retokenised)", "client (client-dropped-field)",
                                     "parser (args-type-coerced)", "template (reasoning-dropped)"]
    at.session_state["watch:breaks"] = {"selection": {"rows": [3], "columns": [], "cells": []}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    text = " ".join(m.value for m in at.markdown)
    assert "**Cause: template** (reasoning-dropped)" in text
