"""SGLang 0.5.23 DeepSeek V3.x/V4 DSML: not emulated yet.

Its golden cases in tests/golden/sglang@0.5.23/deepseek_v4.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class SglangDeepSeekParser(NotEmulated):
    pass
