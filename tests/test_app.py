"""Every page of the Streamlit app through streamlit.testing.v1.AppTest, on the real engine.

AppTest cannot click a dataframe cell: a selection is set through the dataframe's session-state key, as the widget
would, and the script re-runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.models import default_model_ids, load_model
from engine.scenario import scenario_ids

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.fixture
def app(tmp_path, monkeypatch) -> AppTest:
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _select(at: AppTest, scenario: str, column: str) -> None:
    at.session_state["matrix"] = {"selection": {"rows": [], "columns": [],
                                                "cells": [(scenario_ids().index(scenario), column)]}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def test_matrix_page_shows_every_model_and_scenario(app: AppTest) -> None:
    assert app.title[0].value == "Drift matrix"
    frame = app.dataframe[0].value
    assert list(frame.columns) == default_model_ids()
    assert list(frame.index) == scenario_ids()
    assert frame.loc["tool-call", "qwen3.6"] == "✓"
    assert frame.loc["next-user-turn", "qwen3.6"] == "✗ -90tok"
    assert [b.label for b in app.download_button][:2] == ["Matrix CSV", "Matrix JSON"]


def test_selecting_a_cell_opens_its_break_and_the_fix_button_applies_the_kwarg(app: AppTest) -> None:
    _select(app, "next-user-turn", "qwen3.6")
    assert [s.value for s in app.subheader] == ["qwen3.6 × next-user-turn × vllm@0.33.0: breaks"]
    markdown = " ".join(m.value for m in app.markdown)
    assert "**Cause: template** (reasoning-dropped)" in markdown
    assert "Qwen-Qwen3.6-35B-A3B.jinja:114" in markdown
    assert any("class='first'" in h.proto.body for h in app.get("html"))
    assert [b.label for b in app.download_button][-3:] == ["Evidence JSON", "Markdown", "HTML page"]
    assert app.query_params["scenario"] == "next-user-turn"
    app.button(key="detail:fix").click().run()
    assert app.session_state["kw:qwen3.6:preserve_thinking"] is True
    assert [s.value for s in app.subheader] == ["qwen3.6 × next-user-turn × vllm@0.33.0: holds"]
    assert app.dataframe[0].value.loc["next-user-turn", "qwen3.6"] == "✓"


def test_a_parser_break_shows_the_edit_and_the_bridge_fix_switches_the_engine(app: AppTest) -> None:
    app.radio(key="engine_view").set_value("sglang").run()
    _select(app, "args-serialization", "qwen3.5")
    assert [s.value for s in app.subheader] == ["qwen3.5 × args-serialization × sglang@0.5.23: breaks"]
    markdown = " ".join(m.value for m in app.markdown)
    # The model wrote every value as text; the detector converts them by the tool schema and re-dumps them
    # (qwen3_coder_detector.py:229); with the arguments as the model wrote them, the boundary holds.
    assert "**Cause: parser** (args-type-coerced)" in markdown
    assert "blob/v0.5.23/python/sglang/srt/function_call/qwen3_coder_detector.py#L229" in markdown
    captions = [c.value for c in app.caption]
    assert [c for c in captions if c in ("engine was given", "engine returned")] == [
        "engine was given", "engine returned"]
    assert "Proof: re-run with args_convert_dump undone (sglang/srt/function_call/qwen3_coder_detector.py:229): the " \
           "boundary holds (5010/5010 characters)" in captions
    given, returned = (c.value for c in app.code[-2:])
    # whitespace made visible: "5" as the model wrote it, 5 as the engine returned it
    assert given.startswith('{"query":·"Zürich·café·東京",·"limit":·"5",·"exact":·"true"')
    assert returned.startswith('{"query":·"Zürich·café·東京",·"limit":·5,·"exact":·true')
    app.button(key="detail:fix").click().run()
    assert app.radio(key="engine_view").value == "bridge"
    assert [s.value for s in app.subheader] == ["qwen3.5 × args-serialization × bridge: holds"]


def test_side_by_side_view_and_string_level(app: AppTest) -> None:
    app.radio(key="engine_view").set_value("vLLM | SGLang").run()
    frame = app.dataframe[0].value
    assert list(frame.columns)[:2] == ["qwen3.6 · vllm", "qwen3.6 · sglang"]
    app.radio(key="level").set_value("string").run()
    assert app.dataframe[0].value.loc["noncanonical-tokens", "qwen3.6 · vllm"] == "✓ str"


def test_a_link_reopens_the_same_cell(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params.update(engine="raw", model="qwen3.5", scenario="reasoning-whitespace", cell_engine="raw",
                           kwargs='{"qwen3.5": {"enable_thinking": true}}')
    at.run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["qwen3.5 × reasoning-whitespace × raw: breaks"]
    assert at.radio(key="engine_view").value == "raw"


def test_kimi_cells_are_string_level_and_say_why(app: AppTest) -> None:
    app.radio(key="engine_view").set_value("raw").run()
    _select(app, "no-tools-next-user", "kimi-k2.6")
    assert any("tokenizer unavailable for kimi-k2.6" in i.value for i in app.info)
    assert any("String level" in c.value for c in app.caption)


def test_session_page_shows_the_handbook_figures_the_break_and_the_what_ifs(app: AppTest) -> None:
    app.switch_page("pages/session.py").run()
    assert not app.exception
    assert [m.value for m in app.metric] == ["3001", "1037", "1049", "1541"]
    table = app.dataframe[0].value
    assert list(table["prompt"]) == [506, 773, 898, 824]
    assert list(table["reused"]) == [0, 580, 880, 504]
    app.session_state["session:table"] = {"selection": {"rows": [3], "columns": [], "cells": []}}
    app.run()
    markdown = [m.value for m in app.markdown]
    assert "**Request 4** reuses 504 tokens of request 3's 945-token sequence; the texts first differ at char 1767." \
        in markdown
    assert any("class='first'" in h.proto.body for h in app.get("html"))
    # The default experiment is the handbook's exercise: keeping the history, request 4 reuses 945 and prefills 14.
    assert any("request 4 reuses 945 instead of 504, prefills 14 instead of 320" in m for m in markdown)
    app.radio(key="session:what_if").set_value("tools-reordered").run()
    assert any("request 2 reuses 32 instead of 580" in m.value for m in app.markdown)
    # Through vLLM: each reply is the model's written output, so the sequences lack the template's newline after
    # <|im_end|> (tests/test_session_engine.py), and the what-if compares both sides through the engine.
    app.selectbox(key="session:engine").set_value("through vLLM").run()
    assert not app.exception, [e.value for e in app.exception]
    assert list(app.dataframe[0].value["reused"]) == [0, 579, 879, 504]
    assert [m.value for m in app.metric] == ["3001", "1039", "1065", "1543"]
    assert any("request 2 reuses 32 instead of 579" in m.value for m in app.markdown)


def test_custom_template_upload_becomes_a_column(app: AppTest) -> None:
    app.switch_page("pages/custom_templates.py").run()
    assert not app.exception
    source = "\n".join(load_model("qwen3.5").renderer.source_lines()) + "\n"
    app.file_uploader(key="upload:template").upload("mine.jinja", source.encode(), "text/plain")
    app.selectbox(key="upload:base").set_value("qwen3.5")
    app.text_input(key="upload:label").set_value("mine")
    app.button[0].click().run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    assert any("it is now a column next to qwen3.5" in s.value for s in app.success)
    app.switch_page("pages/matrix.py").run()
    frame = app.dataframe[0].value
    assert "qwen3.5+mine" in frame.columns
    # The same template as the stock one: every cell equal, none marked as changed.
    assert list(frame["qwen3.5+mine"]) == list(frame["qwen3.5"])


def test_a_hostile_upload_is_refused_with_its_reason_and_the_app_keeps_working(app: AppTest) -> None:
    app.switch_page("pages/custom_templates.py").run()
    app.file_uploader(key="upload:template").upload("broken.jinja", b"{% for x in %}", "text/plain")
    app.button[0].click().run()
    assert not app.exception
    assert len(app.error) == 1 and "broken.jinja" in app.error[0].value
    app.switch_page("pages/matrix.py").run()
    assert app.dataframe[0].value.loc["tool-call", "qwen3.6"] == "✓"
