"""SGLang 0.5.12 GPT-OSS harmony.

The same code as 0.5.23 for this family unless this module says otherwise."""

from __future__ import annotations

from engine.parsers.sglang_0_5_23.gpt_oss import SglangGptOssParser


class SglangGptOssParser0512(SglangGptOssParser):
    pass
