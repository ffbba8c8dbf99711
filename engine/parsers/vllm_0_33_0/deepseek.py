"""vLLM 0.33.0 DeepSeek V3.x/V4 DSML: not emulated yet.

Its golden cases in tests/golden/vllm@0.33.0/deepseek_v4.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class VllmDeepSeekParser(NotEmulated):
    pass
