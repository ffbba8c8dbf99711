"""The store of prompts (engine/render_store.py): a template's text for a request asked to be kept, kept across runs
and read back equal, with the same provenance; another key for anything the text depends on; nothing kept for a
template that can render one request two ways, a request only rendered, or when the store is off; a tampered entry
rendered again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.models import load_model, load_spec, special_token_vars
from engine.render.cache import CachedRenderer
from engine.render.jinja import JinjaRenderer
from engine.render_store import STORE, PersistedRenders
from engine.serving.real.results import pack_entries, result_cache

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read setup.py."},
    {"role": "assistant", "content": "", "reasoning_content": "I should read it.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "read_file", "arguments": {"path": "setup.py"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "from setuptools import setup\nsetup()"},
]
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


@pytest.fixture
def empty_store(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("DRIFT_RENDER_STORE", "1")
    monkeypatch.setenv("DRIFT_RESULT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _template(model_id: str, source: str | None = None, special_tokens: dict | None = None) -> CachedRenderer:
    """A fresh renderer of the model's real template (as another process would build it), over the store."""
    inner = load_model(model_id).renderer.inner
    return CachedRenderer(JinjaRenderer(inner.template_source if source is None else source, model=model_id,
                                        source_path=inner.source_path,
                                        special_tokens=special_token_vars(load_spec(model_id))
                                        if special_tokens is None else special_tokens),
                          store=PersistedRenders())


def _kept(root: Path) -> list[tuple[Path, int, bytes]]:
    """Every entry the store's packs hold: (its pack, its offset there, its bytes), in the order written."""
    folders = sorted((root / STORE).iterdir()) if (root / STORE).is_dir() else []
    return [(pack, offset, line) for folder in folders for _, pack, offset, line in pack_entries(folder)]


def _render(renderer: CachedRenderer, **kwargs):
    return renderer.render_kept(MESSAGES, TOOLS, add_generation_prompt=True, kwargs=kwargs)


def _next_run() -> None:
    """What another process finds: only the files (the result cache keeps what it read and wrote in memory too)."""
    result_cache().clear_memory()


def _refuse(monkeypatch, renderer: CachedRenderer, *names: str) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("rendered again")

    for name in names:
        monkeypatch.setattr(renderer.inner, name, refused)


def test_a_kept_prompt_comes_back_equal_and_its_provenance_once_read(empty_store, monkeypatch) -> None:
    first = _render(_template("qwen3.6"))
    assert len(_kept(empty_store)) == 1
    _next_run()
    again = _template("qwen3.6")
    _refuse(monkeypatch, again, "render")
    second = _render(again)
    assert again.stored_hits == 1
    assert str(second.text) == str(first.text)
    assert (second.origin, second.source_path) == (first.origin, first.source_path)
    # Its provenance recorded from the template when read, equal to the first's, and kept beside the text ...
    assert second.message_index == first.message_index and second.source_line == first.source_line
    # (Qwen3.6 writes the system message inside its tools block, outside the loop over messages: -1, the template's)
    assert set(first.message_index) == {-1, 1, 2, 3}
    _next_run()
    # ... so that the next run reads it without recording it again
    third_renderer = _template("qwen3.6")
    _refuse(monkeypatch, third_renderer, "render", "_render_recorded")
    third = _render(third_renderer)
    assert third.provenance_computed
    assert (str(third.text), third.message_index, third.source_line) == \
        (str(first.text), first.message_index, first.source_line)


def test_anything_the_text_depends_on_is_another_key(empty_store) -> None:
    renderer = _template("qwen3.6")
    _render(renderer)
    _next_run()
    source = renderer.inner.template_source
    special_tokens = special_token_vars(load_spec("qwen3.6"))
    others = [
        (_template("qwen3.6"), {"enable_thinking": False}),  # a kwarg
        (_template("qwen3.6", source=source + "{# a comment: the same text #}"), {}),  # the source
        (_template("qwen3.6", special_tokens={**special_tokens, "eos_token": "<|endoftext|>"}), {}),
    ]
    for count, (other, kwargs) in enumerate(others, start=2):
        _render(other, **kwargs)
        assert other.stored_hits == 0
        assert len(_kept(empty_store)) == count
    flipped = _template("qwen3.6")
    flipped.render_kept(MESSAGES, TOOLS, add_generation_prompt=False)
    assert flipped.stored_hits == 0 and len(_kept(empty_store)) == 5


def test_a_template_that_reads_the_clock_is_never_kept(empty_store) -> None:
    # GPT-OSS writes today's date (strftime_now), Mistral Small 3.2 too; the other Jinja templates are kept.
    kept_by_model = {m: load_model(m).renderer.store is not None
                     for m in ("qwen3.6", "glm-5.1", "kimi-k2.6", "gpt-oss", "mistral-small-3.2")}
    assert kept_by_model == {"qwen3.6": True, "glm-5.1": True, "kimi-k2.6": True, "gpt-oss": False,
                             "mistral-small-3.2": False}
    for model_id in ("gpt-oss", "mistral-small-3.2"):
        assert "strftime_now" in load_model(model_id).renderer.inner.template_source
        renderer = _template(model_id)
        assert renderer.store is None
        renderer.render_kept([{"role": "user", "content": "Hi."}], None, add_generation_prompt=True)
    assert _kept(empty_store) == []


def test_only_what_is_asked_to_be_kept_is_kept(empty_store) -> None:
    # A trace's or a session's requests are rendered with `render`: kept in memory for the run, not on disk
    renderer = _template("qwen3.6")
    plain = renderer.render(MESSAGES, TOOLS, add_generation_prompt=True)
    assert _kept(empty_store) == []
    kept = _template("qwen3.6")
    assert str(_render(kept).text) == str(plain.text) and len(_kept(empty_store)) == 1


def test_nothing_is_kept_or_read_when_the_store_is_off(empty_store, monkeypatch) -> None:
    monkeypatch.setenv("DRIFT_RENDER_STORE", "0")
    _render(_template("qwen3.6"))
    assert _kept(empty_store) == []
    monkeypatch.setenv("DRIFT_RENDER_STORE", "1")
    monkeypatch.setenv("DRIFT_RESULT_CACHE", "0")
    _render(_template("qwen3.6"))
    assert _kept(empty_store) == []


def test_a_tampered_entry_is_rendered_again(empty_store) -> None:
    first = _render(_template("qwen3.6"))
    ((pack, offset, line),) = _kept(empty_store)
    raw = json.loads(line)
    raw["reply"]["text"] = raw["reply"]["text"].replace("setup.py", "evil.py")
    data = pack.read_bytes()
    pack.write_bytes(data[:offset] + json.dumps(raw).encode() + data[offset + len(line):])
    _next_run()
    again = _template("qwen3.6")
    second = _render(again)
    assert again.stored_hits == 0
    assert str(second.text) == str(first.text)
    assert json.loads(_kept(empty_store)[-1][2])["reply"]["text"] == str(first.text)  # written again, whole
