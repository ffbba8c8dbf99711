"""SGLang 0.5.23 GPT-OSS harmony: not emulated yet.

Its golden cases in tests/golden/sglang@0.5.23/gpt_oss.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class SglangGptOssParser(NotEmulated):
    pass
