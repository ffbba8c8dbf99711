"""SGLang 0.5.23 Kimi K2.x (kimi_k2): not emulated yet.

Its golden cases in tests/golden/sglang@0.5.23/kimi_k2.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class SglangKimiK2Parser(NotEmulated):
    pass
