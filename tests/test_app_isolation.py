"""Five app sessions, one hostile, through AppTest (each AppTest is a session of its own, sharing this process's caches
and the operator's workspace as a server's sessions do): what one session uploads, writes or is refused never shows
in another's page.

The hostile session uploads traces the store refuses (malformed, nested 100k deep, UTF-16 without a byte-order mark,
binary, a name that is markup) and templates the workspace refuses, and runs a conversation that does not parse; the
four others each write and run a conversation of their own. Afterwards nothing was stored, the hostile session sees
its own sentences and the others see none of them, nor each other's conversation. (Stored uploads are global by
design, README "Uploads are global"; the latency others see while one is hostile is benchmarks/hostile_load.py's.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
SAMPLES = ROOT / "samples" / "traces"
DEEP = b"[" * 100_000 + b"]" * 100_000

HOSTILE_TRACES = [
    ("bad.jsonl", (SAMPLES / "malformed" / "openai.jsonl").read_bytes(),
     "bad.jsonl: line 3: response.choices is empty or not a list"),
    ("deep.jsonl", (SAMPLES / "openai.jsonl").read_bytes().splitlines(keepends=True)[0] + DEEP + b"\n",
     "deep.jsonl: line 2: nested too deeply to read (over Python's recursion limit)"),
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


def _open(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
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


def _conversation(owner: int) -> str:
    return (f"id: conversation-of-session-{owner}\ndescription: session {owner}'s own.\npreamble: coding-agent\n"
            f"tools: [get_weather]\nturns:\n  - user: What's the weather in city {owner}?\n"
            f"  - assistant:\n      content: It is sunny in city {owner}.\n  - user: And tomorrow?\n")


@pytest.mark.slow
def test_five_sessions_one_hostile_see_only_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFT_WORKSPACE", str(tmp_path / "workspace"))
    hostile, *others = sessions = [_open("pages/traffic.py") for _ in range(5)]

    # The hostile session: every trace refused with its sentence, shown to it alone.
    for name, data, sentence in HOSTILE_TRACES:
        hostile.file_uploader(key="traffic:file").upload(name, data, "application/octet-stream")
        _submit(hostile, "Store and analyse")
        assert any(e.value.startswith(sentence) or sentence in e.value for e in hostile.error), \
            (name, [e.value for e in hostile.error])
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

    # Nothing hostile was stored: the workspace holds no trace and no upload.
    workspace = tmp_path / "workspace"
    stored = [p for p in workspace.rglob("*") if p.is_file()] if workspace.exists() else []
    assert stored == []

    for at in sessions:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    hostile_words = [name for name, _, _ in HOSTILE_TRACES] + [name for name, _, _ in HOSTILE_TEMPLATES] + \
        ["Your conversation cannot be read", "nested too deeply", "line 3: response.choices"]
    for owner, at in enumerate(others, start=1):
        shown = _texts(at)
        assert not at.error and not at.warning, (owner, [e.value for e in [*at.error, *at.warning]])
        assert "No trace stored yet" in shown
        assert not [w for w in hostile_words if w in shown], owner
        assert f"conversation-of-session-{owner}" in shown
        assert not [n for n in range(1, 5) if n != owner and f"conversation-of-session-{n}" in shown], owner
        assert at.session_state["traffic:row"] == _conversation(owner)
        assert "traffic:trace" not in at.session_state
