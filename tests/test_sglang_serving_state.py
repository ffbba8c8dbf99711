"""One SGLang worker answers many jobs on the serving object a server with that parser pair holds
(engine/serving/real/glue_sglang.py Glue.serving): each answer must be what the release gives that job alone, whatever
the worker was asked before (another force_reasoning, another server's default chat-template kwargs)."""

from __future__ import annotations

import pytest
from conftest import require_release

from engine.serving.real import backend

pytestmark = pytest.mark.real_engine

QWEN_VOCAB = {"<think>": 151667, "</think>": 151668, "<tool_call>": 151657, "</tool_call>": 151658}
# No opening <think>: only a forced reasoning start makes "hmm" reasoning
OUTPUT = "hmm\n</think>\n\nSure."
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def sglang(monkeypatch: pytest.MonkeyPatch) -> backend.RealEngine:
    require_release("sglang@0.5.23")
    monkeypatch.setenv("DRIFT_RESULT_CACHE", "0")  # every job asked of the worker
    backend.stop_workers()
    yield backend.RealEngine("sglang", "0.5.23")
    backend.stop_workers()


def _parse(engine: backend.RealEngine, force_reasoning: bool) -> tuple:
    result = engine.parse(OUTPUT, reasoning_parser="qwen3", tool_parser="qwen3_coder", added_tokens=QWEN_VOCAB,
                          force_reasoning=force_reasoning, trace=False)
    return result.reasoning, result.content, result.error


def _render(engine: backend.RealEngine, server_defaults: dict | None) -> dict:
    job = {"renderer": "jinja", "messages": MESSAGES, "tools": None, "chat_template_kwargs": {},
           "chat_template": TEMPLATE, "reasoning_parser": "qwen3", "tool_parser": "qwen3_coder"}
    if server_defaults is not None:
        job["server"] = {"default-chat-template-kwargs": server_defaults}
    return engine.render_request(job)["template_kwargs"]


def test_each_answer_is_the_jobs_own_whatever_was_asked_before(sglang: backend.RealEngine) -> None:
    forced, unforced = _parse(sglang, True), _parse(sglang, False)
    assert forced == ("hmm\n", "\n\nSure.", None)
    assert unforced == (None, "hmm\n</think>\n\nSure.", None)
    with_defaults = _render(sglang, {"enable_thinking": False})
    assert with_defaults["enable_thinking"] is False
    assert "enable_thinking" not in _render(sglang, None)
    # interleaved on the same worker, in another order: the same answers
    assert _render(sglang, {"enable_thinking": False}) == with_defaults
    assert _parse(sglang, False) == unforced
    assert _parse(sglang, True) == forced
    assert _parse(sglang, False) == unforced
    assert "enable_thinking" not in _render(sglang, None)
