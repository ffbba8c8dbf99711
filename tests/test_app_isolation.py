"""App sessions through AppTest (each AppTest is a session of its own, sharing this process's caches and the operator's
workspace folder as a server's sessions do): what one session uploads, stores, writes or is refused never shows in
another's page, and a reload (the same link, hence the same workspace key) keeps what it stored.

Two sessions: one uploads a template and a trace, the other sees neither; the first one's link opened again sees both.
Five sessions, one hostile: the hostile one uploads traces with bad records (kept in its own workspace, the bad line
named) and traces the store refuses (UTF-16 without a byte-order mark, binary, a name that is markup), templates the
workspace refuses, and runs a conversation that does not parse; the four others each write and run a conversation of
their own and see none of it, nor each other's conversation. (The latency others see while one is hostile is
benchmarks/hostile_load.py's; the same in a real browser: tests/test_browser.py.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from conftest import APP_RUN_BOUND_S
from streamlit.testing.v1 import AppTest

from engine.assets import resolve_asset
from engine.models import load_spec
from engine.traces.store import TraceStore
from engine.workspace import Workspace, visitor_workspace
from pages.common import plain

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
SAMPLES = ROOT / "samples" / "traces"
DEEP = b"[" * 100_000 + b"]" * 100_000

# Stored in the hostile session's own workspace, the bad record named: (name, bytes, the bad line, what was kept)
KEPT_TRACES = [
    ("bad.jsonl", (SAMPLES / "malformed" / "openai.jsonl").read_bytes(),
     "bad.jsonl: line 3: response.choices is empty or not a list", "2 requests are"),
    ("deep.jsonl", (SAMPLES / "openai.jsonl").read_bytes().splitlines(keepends=True)[0] + DEEP + b"\n",
     "deep.jsonl: line 2: nested too deeply to read (over Python's recursion limit)", "1 request is"),
]
# Refused whole: no record of them is a request
HOSTILE_TRACES = [
    ("utf16.jsonl", (SAMPLES / "openai.jsonl").read_text(encoding="utf-8").encode("utf-16-le"),
     "utf16.jsonl: line 1 holds NUL bytes: it is a binary file, or UTF-16 without a byte-order mark (save it as "
     "UTF-8)"),
    ("<b>x</b>.log", b"\x89PNG\r\n\x1a\n", "<b>x</b>.log: line 1 is not any trace format read here"),
]
HOSTILE_TEMPLATES = [
    ("loop.jinja", b"{% for m in messages %}{{ m.content }", "upload:template"),
    ("binary.jinja", b"\x00\x01\x02", "upload:template"),
]
HOSTILE_YAML = "id: x\nturns: " + "[" * 10_000 + "]" * 10_000


def _open(page: str, key: str | None = None) -> AppTest:
    """A new browser session on `page`; `key`: a link's workspace key (a reload or a shared link)."""
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    if key is not None:
        at.query_params["workspace"] = key
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _texts(at: AppTest) -> str:
    """Everything a session's page shows as text: markdown, messages, captions, headers and table cells."""
    parts = [e.value for kind in ("markdown", "error", "warning", "success", "info", "caption", "title", "subheader")
             for e in getattr(at, kind)]
    parts += [frame.value.to_string() for frame in at.dataframe]
    return "\n".join(str(p) for p in parts)


def _submit(at: AppTest, label: str) -> None:
    next(b for b in at.button if b.label == label).click().run()
    assert not at.exception, [e.value for e in at.exception]


def _key(at: AppTest) -> str:
    """The workspace key the session's link holds."""
    return at.query_params["workspace"]


def _conversation(owner: int) -> str:
    return (f"id: conversation-of-session-{owner}\ndescription: session {owner}'s own.\npreamble: coding-agent\n"
            f"tools: [get_weather]\nturns:\n  - user: What's the weather in city {owner}?\n"
            f"  - assistant:\n      content: It is sunny in city {owner}.\n  - user: And tomorrow?\n")


def test_one_sessions_upload_and_trace_are_its_own_and_a_reload_keeps_them(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    spec = load_spec("qwen3.5")
    template = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"]).data
    trace = (SAMPLES / "sglang-0.5.23.log").read_bytes()
    owner, other = _open("pages/custom_templates.py"), _open("pages/custom_templates.py")
    assert _key(owner) != _key(other)

    owner.file_uploader(key="upload:template").upload("mine.jinja", template, "text/plain")
    owner.selectbox(key="upload:base").set_value("qwen3.5")
    owner.text_input(key="upload:label").set_value("mine")
    _submit(owner, "Upload and validate")
    assert [s.value for s in owner.success][0].startswith("Stored as ")
    owner.switch_page("pages/traffic.py").run()
    owner.file_uploader(key="traffic:file").upload("server.log", trace, "application/octet-stream")
    _submit(owner, "Store and analyse")
    assert [s.value for s in owner.success] == [plain(
        f"Stored server.log (sglang-log, 11 requests, 5 session(s)) as {hashlib.sha256(trace).hexdigest()[:16]} in "
        "your workspace.")]

    # Stored in the owner's own workspace; the operator's holds neither.
    own = visitor_workspace(_key(owner), tmp_path / "workspace")
    assert [u.model_id for u in own.list()] == ["qwen3.5+mine"]
    assert [t.name for t in TraceStore(own.root).list()[0]] == ["server.log"]
    assert Workspace(tmp_path / "workspace").list().uploads == ()
    assert TraceStore(tmp_path / "workspace").list() == ([], [])

    # The other session sees neither: no listing, no column, no trace.
    other.run()
    assert not other.exception
    assert [i.value for i in other.info] == ["No uploads yet."]
    assert "mine" not in _texts(other)
    other.switch_page("pages/traffic.py").run()
    assert "No trace stored yet: upload one above, or try a sample from samples/traces/." in _texts(other)
    assert not other.get("selectbox") or "server.log" not in str([s.options for s in other.selectbox])
    other.switch_page("pages/matrix.py").run()
    assert not [c for c in other.dataframe[0].value.columns if "+" in c]

    # The owner's link opened again (a reload, a bookmark): both are there, the upload a matrix column again.
    again = _open("pages/custom_templates.py", _key(owner))
    assert _key(again) == _key(owner)
    assert any("qwen3.5+mine" in m.value for m in again.markdown)
    again.switch_page("pages/traffic.py").run()
    assert again.selectbox(key="traffic:pick").value == TraceStore(own.root).list()[0][0].id
    again.switch_page("pages/matrix.py").run()
    assert "qwen3.5+mine" in again.dataframe[0].value.columns


def test_a_link_whose_workspace_key_is_not_one_gets_a_new_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    at = AppTest.from_file(APP, default_timeout=APP_RUN_BOUND_S)
    at.query_params["workspace"] = "../../etc"
    at.run()  # the matrix, where the link opens
    assert not at.exception, [e.value for e in at.exception]
    assert [w.value for w in at.warning] == [plain(
        "The link's workspace key was not used (a workspace key is 22 letters, digits, '-' and '_'); this page has a "
        "new workspace of its own.")]
    assert _key(at) != "../../etc" and len(_key(at)) == 22
    assert list((tmp_path / "workspace").glob("**/*")) == []


def test_five_sessions_one_hostile_see_only_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    hostile, *others = sessions = [_open("pages/traffic.py") for _ in range(5)]

    # The hostile session: traces with a bad record are kept with the bad line named, the others refused with their
    # sentence; shown to it alone.
    for name, data, bad_line, kept in KEPT_TRACES:
        hostile.file_uploader(key="traffic:file").upload(name, data, "application/octet-stream")
        _submit(hostile, "Store and analyse")
        assert not hostile.error, [e.value for e in hostile.error]
        assert [w.value for w in hostile.warning] == [
            plain(f"{name}: 1 bad record left out; its other {kept} analysed below.") + "\n\n- "
            + plain(bad_line)]
    for name, data, sentence in HOSTILE_TRACES:
        hostile.file_uploader(key="traffic:file").upload(name, data, "application/octet-stream")
        _submit(hostile, "Store and analyse")
        assert any(e.value.startswith(plain(sentence)) for e in hostile.error), (name, [e.value for e in hostile.error])
    hostile.text_area(key="traffic:yaml_editor").set_value(HOSTILE_YAML)
    hostile.button(key="traffic:run_row").click().run()
    assert not hostile.exception, [e.value for e in hostile.exception]
    assert [e.value for e in hostile.error][-1].startswith("Your conversation cannot be read: ")

    # Each other session runs a conversation of its own.
    for owner, at in enumerate(others, start=1):
        at.text_area(key="traffic:yaml_editor").set_value(_conversation(owner))
        at.button(key="traffic:run_row").click().run()
        assert not at.exception, [e.value for e in at.exception]

    # The hostile session also tries templates on the Custom templates page.
    hostile.switch_page("pages/custom_templates.py").run()
    for name, data, key in HOSTILE_TEMPLATES:
        hostile.file_uploader(key=key).upload(name, data, "text/plain")
        _submit(hostile, "Upload and validate")
        assert hostile.error, name

    # What was stored is the hostile session's two traces, in its own workspace; no template anywhere.
    workspace = tmp_path / "workspace"
    own = visitor_workspace(_key(hostile), workspace)
    assert sorted(t.name for t in TraceStore(own.root).list()[0]) == ["bad.jsonl", "deep.jsonl"]
    assert own.list().uploads == ()
    stored = [p for p in workspace.rglob("*") if p.is_file() and not p.is_relative_to(own.root)]
    assert stored == []

    for at in sessions:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    hostile_words = [t[0] for t in KEPT_TRACES + HOSTILE_TRACES] + \
        [name for name, _, _ in HOSTILE_TEMPLATES] + \
        ["Your conversation cannot be read", "nested too deeply", "line 3: response.choices", "bad record"]
    for owner, at in enumerate(others, start=1):
        shown = _texts(at)
        assert not at.error and not at.warning, (owner, [e.value for e in [*at.error, *at.warning]])
        assert "No trace stored yet" in shown
        assert not [w for w in hostile_words if w in shown], owner
        assert f"conversation-of-session-{owner}" in shown
        assert not [n for n in range(1, 5) if n != owner and f"conversation-of-session-{n}" in shown], owner
        assert at.session_state["traffic:row"] == _conversation(owner)
        assert "traffic:trace" not in at.session_state
