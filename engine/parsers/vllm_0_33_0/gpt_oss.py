"""vLLM 0.33.0 GPT-OSS harmony: not emulated yet.

Its golden cases in tests/golden/vllm@0.33.0/gpt_oss.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class VllmGptOssParser(NotEmulated):
    pass
