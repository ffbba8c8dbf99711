"""Every page of the Streamlit app through streamlit.testing.v1.AppTest, on the real engine.

AppTest cannot click a dataframe cell: a selection is set through the dataframe's session-state key, as the widget
would, and the script re-runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import APP_RUN_BOUND_S
from streamlit.testing.v1 import AppTest

from engine.models import default_model_ids, load_model
from engine.scenario import scenario_ids
from pages.common import plain

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.fixture
def app(tmp_path, monkeypatch) -> AppTest:
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
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
    # The condition that drops the reasoning first, the line that emitted the differing character second.
    assert "at [`Qwen-Qwen3.6-35B-A3B.jinja:100-103`]" in markdown
    assert "Emitted at Qwen-Qwen3.6-35B-A3B.jinja:114:" in [t.value for t in app.text]
    assert any("class='first'" in h.proto.body for h in app.get("html"))
    assert [b.label for b in app.download_button][-3:] == ["Evidence JSON", "Markdown", "HTML page"]
    assert app.query_params["scenario"] == "next-user-turn"
    app.button(key="detail:fix").click().run()
    assert app.session_state["kw:qwen3.6:preserve_thinking"] is True
    assert [s.value for s in app.subheader] == ["qwen3.6 × next-user-turn × vllm@0.33.0: holds"]
    frame = app.dataframe[0].value  # the toggled kwarg marks its column
    assert list(frame.columns) == ["qwen3.6 ✎", *default_model_ids()[1:]]
    assert frame.loc["next-user-turn", "qwen3.6 ✎"] == "✓"
    assert any(e.label == "qwen3.6 ✎ preserve_thinking" for e in app.sidebar.expander)


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
    # Captions are Markdown: the proof (it quotes templates and model text) is shown escaped, as text.
    assert plain("Proof: re-run with args_convert_dump undone (sglang/srt/function_call/qwen3_coder_detector.py:229): "
                 "the boundary holds (5033/5033 characters)") in captions
    given, returned = (c.value for c in app.code[-2:])
    # whitespace made visible: "5" as the model wrote it, 5 as the engine returned it
    assert given.startswith('{"query":·"Zürich·café·東京",·"limit":·"5",·"exact":·"true"')
    assert returned.startswith('{"query":·"Zürich·café·東京",·"limit":·5,·"exact":·true')
    app.button(key="detail:fix").click().run()
    assert app.radio(key="engine_view").value == "bridge"
    assert [s.value for s in app.subheader] == ["qwen3.5 × args-serialization × bridge: holds"]


def test_side_by_side_view_and_string_level(app: AppTest) -> None:
    app.selectbox(key="ver:sglang").set_value("0.5.12")
    app.radio(key="engine_view").set_value("vLLM | SGLang").run()
    frame = app.dataframe[0].value
    assert list(frame.columns) == default_model_ids()  # a row per engine, so the columns stay one per model
    assert list(frame.index)[:4] == ["args-serialization · vllm@0.33.0", "args-serialization · sglang@0.5.12",
                                     "client-drops-reasoning · vllm@0.33.0", "client-drops-reasoning · sglang@0.5.12"]
    # ≠ on both rows where the engines differ (here GLM's re-serialized arguments lose different amounts).
    assert (frame.loc["args-serialization · vllm@0.33.0", "glm-5.1"],
            frame.loc["args-serialization · sglang@0.5.12", "glm-5.1"]) == ("≠ ✗ -41tok", "≠ ✗ -28tok")
    assert frame.loc["tool-call · vllm@0.33.0", "qwen3.6"] == "✓"
    _select(app, "args-serialization", "glm-5.1")  # row 0 is the vLLM row
    assert [s.value for s in app.subheader] == ["glm-5.1 × args-serialization × vllm@0.33.0: breaks"]
    app.session_state["matrix"] = {"selection": {"rows": [], "columns": [], "cells": [(1, "glm-5.1")]}}
    app.run()
    assert [s.value for s in app.subheader] == ["glm-5.1 × args-serialization × sglang@0.5.12: breaks"]
    app.radio(key="level").set_value("string").run()
    assert app.dataframe[0].value.loc["noncanonical-tokens · vllm@0.33.0", "qwen3.6"] == "✓ str"


def test_a_link_reopens_the_same_cell(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.query_params.update(engine="raw", model="qwen3.5", scenario="reasoning-whitespace", cell_engine="raw",
                           kwargs='{"qwen3.5": {"enable_thinking": true}}')
    at.run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["qwen3.5 × reasoning-whitespace × raw: breaks"]
    assert at.radio(key="engine_view").value == "raw"


def test_a_link_opens_a_column_with_layers_and_its_proxy_cause(tmp_path, monkeypatch) -> None:
    """The sidebar's layers come from a link; the cell says which layers it passed and shows the proxy's rewrite."""
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.query_params.update(engine="raw", runtime="minijinja", proxies="langchain-openai", model="qwen3.6",
                           scenario="tool-call", cell_engine="raw@minijinja+langchain-openai")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert (at.selectbox(key="layer:runtime").value, at.multiselect(key="layer:proxies").value) == (
        "MiniJinja", ["langchain-openai"])
    assert [s.value for s in at.subheader] == ["qwen3.6 × tool-call × raw@minijinja+langchain-openai: breaks"]
    markdown = " ".join(m.value for m in at.markdown)
    assert "**Cause: proxy** (proxy-rewrote) at `proxy_profiles/langchain-openai.yaml:7`" in markdown
    captions = [c.value for c in at.caption]
    assert plain("Layers passed, client side first: langchain-openai (client profile: langchain-openai 1.8.1, "
                 "langchain_openai/chat_models/base.py:476-558 (_convert_message_to_dict)) → MiniJinja 3.1.0 (template "
                 "runtime).") in captions
    assert [c for c in captions if c in ("the client sent", "the proxy forwarded")] == [
        "the client sent", "the proxy forwarded"]
    assert at.query_params["runtime"] == "minijinja"


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
    assert list(table["decode"]) == ["74", "107", "47", "…"]  # the last reply is not scripted: "…", not None
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


def test_session_page_gpt_oss_decode_is_never_negative(app: AppTest) -> None:
    app.switch_page("pages/session.py").run()
    app.selectbox(key="session:model").set_value("gpt-oss").run()
    assert not app.exception, [e.value for e in app.exception]
    assert list(app.dataframe[0].value["decode"]) == ["76", "103", "52", "…"]


def test_custom_page_opened_first_keeps_the_stored_uploads_as_columns(tmp_path, monkeypatch) -> None:
    from engine.workspace import Workspace

    source = ("\n".join(load_model("qwen3.5").renderer.source_lines()) + "\n").encode()
    upload = Workspace(tmp_path / "workspace").add("qwen3.5", {"chat_template": ("mine.jinja", source)}, "mine")
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.switch_page("pages/custom_templates.py").run()  # a browser session whose first page is Custom templates
    assert not at.exception, [e.value for e in at.exception]
    assert at.checkbox(key=f"show:{upload.id}").value is True
    at.switch_page("pages/matrix.py").run()
    assert "qwen3.5+mine" in at.dataframe[0].value.columns


def test_a_custom_cell_exports_evidence_holding_its_template(tmp_path, monkeypatch) -> None:
    from engine.workspace import Workspace

    source = ("\n".join(load_model("qwen3.5").renderer.source_lines()) + "\n").encode()
    Workspace(tmp_path / "workspace").add("qwen3.5", {"chat_template": ("keep.jinja", source)}, "keep")
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.run()
    _select(at, "next-user-turn", "qwen3.5+keep")
    assert not at.exception, [e.value for e in at.exception]
    assert [s.value for s in at.subheader] == ["qwen3.5+keep × next-user-turn × vllm@0.33.0: breaks"]
    assert "Evidence JSON" in [b.label for b in at.download_button]
    # tests/test_evidence.py replays such a file; here the page says what the export carries.
    assert any(c.value == "The evidence JSON carries keep.jinja (the upload's template text): `python -m engine "
               "replay FILE` rebuilds this column anywhere." for c in at.caption)


def test_an_error_cell_shows_where_why_and_the_fix(app: AppTest) -> None:
    # The template alone (vLLM renders gpt-oss through openai-harmony, where this cell holds).
    app.radio(key="engine_view").set_value("raw").run()
    _select(app, "reasoning-truncated", "gpt-oss")
    assert [s.value for s in app.subheader] == ["gpt-oss × reasoning-truncated × raw: error"]
    assert "raised at line 314" in app.error[0].value
    markdown = [m.value for m in app.markdown]
    assert "**Failed at** [`openai-gpt-oss-120b.jinja:314`](https://huggingface.co/openai/gpt-oss-120b/blob/main/" \
           "chat_template.jinja#L314)" in markdown
    assert any(m.startswith("**Why:** the template reads `message.content` unconditionally") for m in markdown)
    assert any(m.startswith("**Fix:** send the key") for m in markdown)
    assert any("background:#fff8c5;font-weight:600'><td>314</td>" in h.proto.body for h in app.get("html"))


def test_uploaders_show_the_limits_validation_enforces(app: AppTest, monkeypatch) -> None:
    app.switch_page("pages/custom_templates.py").run()
    sizes = {u.proto.label.split(":")[0]: u.proto.max_upload_size_mb for u in app.get("file_uploader")}
    assert sizes == {"Chat template": 5, "Optional tokenizer": 50}  # not Streamlit's 200 MB default
    monkeypatch.setenv("DRIFT_UPLOAD_MAX_TEXT_BYTES", str(1024 * 1024))
    app.run()
    assert app.get("file_uploader")[0].proto.max_upload_size_mb == 1


def test_streamlit_config_is_an_offline_tools() -> None:
    import tomllib

    config = tomllib.loads((Path(APP).parent / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["browser"]["gatherUsageStats"] is False
    assert config["client"]["toolbarMode"] == "minimal"
    assert config["server"]["maxUploadSize"] == 50


def test_reasoning_effort_is_a_control_and_marks_its_column(app: AppTest) -> None:
    control = app.selectbox(key="kw:gpt-oss:reasoning_effort")
    assert (control.value, control.options) == ("medium", ["low", "medium", "high"])
    control.set_value("high").run()
    assert "gpt-oss ✎" in app.dataframe[0].value.columns
    assert app.query_params["kwargs"] == '{"gpt-oss": {"reasoning_effort": "high"}}'
    _select(app, "tool-call", "gpt-oss ✎")
    assert 'reasoning_effort="high"' in " ".join(c.value for c in app.caption)


def test_headers_carry_tooltips_and_the_legend_explains_every_mark(app: AppTest) -> None:
    import json

    config = json.loads(app.dataframe[0].proto.columns)
    assert config["_index"]["help"].startswith("- **args-serialization**: ")
    assert config["qwen3.6"]["help"] == "Qwen3.6 (Qwen/Qwen3.6-35B-A3B): template Qwen-Qwen3.6-35B-A3B.jinja"
    legend = " ".join(c.value for c in app.caption)
    for mark in ("✓ holds", "✗ -N tok", "✓ str:", "! error", "– unavailable", "◆ your upload", "✎ the column's"):
        assert mark in legend
