"""vLLM 0.33.0 Kimi K2.x (kimi_k2): not emulated yet.

Its golden cases in tests/golden/vllm@0.33.0/kimi_k2.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class VllmKimiK2Parser(NotEmulated):
    pass
