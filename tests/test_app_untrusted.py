"""Issue 15 on the pages, through AppTest on the real engine: what one visitor stores or links never breaks the
explorer for another. Stored items that today's validation would refuse are written with tests/stored.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import APP_RUN_BOUND_S
from stored import replace_stored
from streamlit.testing.v1 import AppTest
from test_untrusted import rank_table

from engine.assets import resolve_asset
from engine.models import load_model
from engine.workspace import Workspace, new_visitor_key, visitor_workspace
from pages.common import plain

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.fixture(scope="module")
def template() -> bytes:
    spec = load_model("qwen3.5").spec
    return resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"]).data


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Workspace:
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    return Workspace(tmp_path / "workspace")


def _app(page: str | None = None, **params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.query_params.update(params)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page:
        at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def _upload(at: AppTest, name: str, data: bytes, label: str = "custom", base: str = "qwen3.5") -> None:
    at.file_uploader(key="upload:template").upload(name, data, "text/plain")
    at.selectbox(key="upload:base").set_value(base)
    at.text_input(key="upload:label").set_value(label)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]


# 1: a stored Kimi rank table without "Z" used to panic the matrix page for every session.
def test_a_stored_rank_table_that_would_panic_marks_its_column_not_the_page(workspace):
    upload = workspace.add("kimi-k2.6", {"tiktoken": ("tiktoken.model", rank_table(None))}, "mine")
    replace_stored(upload, "tiktoken", rank_table(b"Z"))
    at = _app()
    frame = at.dataframe[0].value
    assert set(frame["kimi-k2.6+mine"]) == {"! ◆"}  # an error, where the stock Kimi column has results
    assert frame.loc["tool-call", "qwen3.6"] == "✓"
    at.session_state["matrix"] = {"selection": {"rows": [], "columns": [], "cells": [(0, "kimi-k2.6+mine")]}}
    at.run()
    assert not at.exception
    assert any("the rank table lacks the single byte 0x5a" in e.value for e in at.error)


# 2: two uploads labelled "custom" for one base model used to crash the matrix (a non-unique column index).
def test_two_uploads_with_one_label_are_two_columns(workspace, template):
    first = workspace.add("qwen3.5", {"chat_template": ("a.jinja", template)}, "custom")
    second = workspace.add("qwen3.5", {"chat_template": ("b.jinja", template + b"\n")}, "custom")
    meta = json.loads((second.path / "meta.json").read_text())
    (second.path / "meta.json").write_text(json.dumps({**meta, "label": "custom"}))  # as an older store left it
    frame = _app().dataframe[0].value
    assert [c for c in frame.columns if c.startswith("qwen3.5+")] == ["qwen3.5+custom",
                                                                      f"qwen3.5+custom-{second.id[:8]}"]
    assert list(frame["qwen3.5+custom"]) == list(frame["qwen3.5"])
    assert first.label == "custom"


# 3: a template that renders the probe but loops on later turns used to be accepted in 0.01 s.
def test_a_late_looping_template_is_refused_on_the_page(workspace, template, monkeypatch):
    monkeypatch.setenv("DRIFT_RENDER_TIMEOUT_S", "1.5")
    sneaky = (b"{%- if messages | selectattr('role', 'equalto', 'tool') | list %}{% for i in range(100000) %}"
              b"{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + template)
    at = _app("pages/custom_templates.py")
    _upload(at, "sneaky.jinja", sneaky)
    assert [e.value for e in at.error] == [plain(
        "sneaky.jinja for model qwen3.5 (upload) was stopped after 1.5 s (render time limit) on scenario "
        "args-serialization; a template that hits a limit on any scenario is refused, so that no view waits on it")]
    assert workspace.list().uploads == ()


# 4: the workspace folder used to be a text field (a visitor could list /etc and write or delete there).
def test_uploads_go_to_the_visitors_own_workspace_and_the_operators_are_shared_read_only(workspace, template,
                                                                                         monkeypatch):
    shared_upload = workspace.add("qwen3.5", {"chat_template": ("shared.jinja", template + b"\n")}, "shared")
    at = _app("pages/custom_templates.py")
    assert [t.label for t in at.text_input] == ["Label (the matrix column is named model+label)"]
    assert any(c.value == plain(f"Every visitor sees these, read-only: {workspace.root} (the operator's workspace, "
                                "DRIFT_WORKSPACE; python -m engine uses it).") for c in at.caption)
    _upload(at, "mine.jinja", template, "mine")
    own = visitor_workspace(at.query_params["workspace"], workspace.root)
    upload = own.list().uploads[0]
    listed = [m.value for m in at.markdown if "qwen3.5+" in m.value]
    assert listed == [plain(f"qwen3.5+mine · {upload.id[:12]} · uploaded {upload.created} by an anonymous visitor · "
                            "chat_template: mine.jinja"),
                      plain(f"qwen3.5+shared · {shared_upload.id[:12]} · uploaded {shared_upload.created} · "
                            "chat_template: shared.jinja")]
    assert [u.id for u in workspace.list()] == [shared_upload.id]  # the operator's workspace is not written
    assert [b.key for b in at.button if b.label == "Remove"] == [f"remove:{upload.id}"]  # one's own only
    monkeypatch.setenv("DRIFT_WORKSPACE_READONLY", "1")
    shared = _app("pages/custom_templates.py")
    assert not shared.get("file_uploader") and not [b for b in shared.button if b.label == "Remove"]
    assert any("read-only (DRIFT_WORKSPACE_READONLY)" in i.value for i in shared.info)
    assert [c.label for c in shared.checkbox] == ["show in matrix"]  # the shared upload; not the other visitor's


# 6 and 9: a crafted link used to crash the page (a string for a checkbox) or open any YAML file on disk.
@pytest.mark.parametrize("params,warning", [
    ({"kwargs": '{"qwen3.6": {"enable_thinking": "yes"}}'},
     "The link's kwarg 'enable_thinking' for qwen3.6 was ignored: it must be bool, got \"yes\"."),
    ({"kwargs": '{"qwen3.6": {"enable_thinking": null}}'},
     "The link's kwarg 'enable_thinking' for qwen3.6 was ignored: it must be bool, got null."),
    ({"kwargs": "[1, 2]"}, "The link's kwargs parameter must be an object of model ids; it was ignored."),
    ({"kwargs": "null"}, "The link's kwargs parameter must be an object of model ids; it was ignored."),
    ({"kwargs": '{"qwen3.6": [1]}'}, "The link's kwargs for 'qwen3.6' were ignored: they must be an object."),
    ({"kwargs": '{"qwen3.6": {"nosuch": true}}'},
     "The link's kwarg 'nosuch' for qwen3.6 was ignored: not one of its template kwargs."),
    ({"model": "qwen3.6", "scenario": "../../x", "cell_engine": "raw"},
     "The link's cell was not opened: unknown scenario '../../x'."),
    ({"model": "../x", "scenario": "tool-call", "cell_engine": "raw"},
     "The link's cell was not opened: unknown model '../x'."),
    ({"model": "qwen3.6", "scenario": "tool-call", "cell_engine": "vllm@9"},
     # Any release on PyPI is an engine (run from its own code); 9 is none of them.
     "The link's cell was not opened: unknown engine 'vllm@9': vllm@9 is not a release on PyPI from 0.10.0 on."),
    ({"model": "qwen3.6", "scenario": "tool-call", "cell_engine": "raw", "upload": "0123456789abcdef"},
     "The link's cell was not opened: no stored upload '0123456789abcdef'."),
], ids=["string-for-bool", "null-for-bool", "list", "null", "model-list", "unknown-kwarg", "scenario-path",
        "model-path", "engine", "upload"])
def test_a_crafted_link_is_one_warning(workspace, params, warning):
    at = _app(**params)
    assert [w.value for w in at.warning] == [plain(warning)]
    assert at.dataframe[0].value.loc["tool-call", "qwen3.6"] == "✓"
    assert not at.subheader  # no cell opened


# 8: user-controlled text used to render as Markdown (an image fetched by every viewer's browser).
def test_user_text_is_shown_as_text(workspace, template):
    at = _app("pages/custom_templates.py")
    name = "![x](http://example.invalid/p.png).jinja"
    _upload(at, name, b"{% for x in %}")
    (error,) = [e.value for e in at.error]
    assert error.startswith(plain(name) + " does not parse: ")
    assert "](" not in error and "http://" not in error
    upload = workspace.add("qwen3.5", {"chat_template": ("a.jinja", template)}, "a")
    replace_stored(upload, "chat_template", b"{{ raise_exception('![x](http://example.invalid/p.png)') }}")
    matrix = _app()
    matrix.session_state["matrix"] = {"selection": {"rows": [], "columns": [], "cells": [(0, "qwen3.5+a")]}}
    matrix.run()
    assert [e.value for e in matrix.error] == [plain("a.jinja for model qwen3.5+a raised at line 1: "
                                                     "![x](http://example.invalid/p.png)")]


# 13: junk used to be one warning box each; interrupted writes were never cleaned.
def test_junk_is_one_box_and_interrupted_writes_are_removed_at_start(workspace, template):
    key = new_visitor_key()
    own = visitor_workspace(key, workspace.root)
    kept = own.add("qwen3.5", {"chat_template": ("a.jinja", template)}, "kept")
    for n in range(2008):
        (own.root / f"junk-{n}").write_text("x")
    staging = own.root / ".tmp-0123456789abcdef-00000000"
    staging.mkdir()
    (staging / "part").write_bytes(b"x" * 1024)
    old = time.time() - 3600
    os.utime(staging, (old, old))
    at = _app("pages/custom_templates.py", workspace=key)
    assert [w.value for w in at.warning] == [plain(
        f"2008 entries in {own.root} are not an upload folder and were skipped: junk-0, junk-1, junk-10, "
        "junk-100, junk-1000, and 2003 more")]
    assert [i.value for i in at.info] == [plain(
        f"Removed 1 interrupted upload or removal from {own.root} (0.0 MB): .tmp-0123456789abcdef-00000000.")]
    assert not staging.exists()
    assert any(kept.id[:12] in m.value for m in at.markdown)


# 14: "It is now a column" used to be shown for an upload that this session's checkbox kept hidden.
def test_an_upload_hidden_before_is_a_column_again_when_uploaded_again(workspace, template):
    at = _app("pages/custom_templates.py")
    _upload(at, "mine.jinja", template, "mine")
    at.checkbox[0].uncheck().run()
    _upload(at, "mine.jinja", template, "mine")
    assert any("it is now a column next to qwen3.5" in s.value for s in at.success)
    at.switch_page("pages/matrix.py").run()
    assert "qwen3.5+mine" in at.dataframe[0].value.columns
