"""SGLang 0.5.12 DeepSeek V3.x/V4 DSML.

The same code as 0.5.23 for this family unless this module says otherwise."""

from __future__ import annotations

from engine.parsers.sglang_0_5_23.deepseek import SglangDeepSeekParser


class SglangDeepSeekParser0512(SglangDeepSeekParser):
    pass
