"""SGLang 0.5.12: as 0.5.23 except where the older code differs (mainly: reasoning and content were stripped)."""

from __future__ import annotations

from engine.parsers.sglang_0_5_12.qwen3 import SglangQwen3Parser0512
from engine.parsers.sglang_0_5_23 import SglangEmulation


class Sglang0512Emulation(SglangEmulation):
    version = "0.5.12"
    qwen3_parser = SglangQwen3Parser0512
