"""SGLang 0.5.12: as 0.5.23 except where the older code differs (mainly: reasoning and content were stripped)."""

from __future__ import annotations

from engine.parsers.base import FamilyParser
from engine.parsers.sglang_0_5_12.deepseek import SglangDeepSeekParser0512
from engine.parsers.sglang_0_5_12.glm import SglangGlmParser0512
from engine.parsers.sglang_0_5_12.gpt_oss import SglangGptOssParser0512
from engine.parsers.sglang_0_5_12.kimi_k2 import SglangKimiK2Parser0512
from engine.parsers.sglang_0_5_12.qwen3 import SglangQwen3Parser0512
from engine.parsers.sglang_0_5_23 import SglangEmulation


class Sglang0512Emulation(SglangEmulation):
    version = "0.5.12"
    families: dict[str, type[FamilyParser]] = {
        "qwen3": SglangQwen3Parser0512,
        "glm": SglangGlmParser0512,
        "kimi_k2": SglangKimiK2Parser0512,
        "deepseek": SglangDeepSeekParser0512,
        "gpt_oss": SglangGptOssParser0512,
    }
