"""SGLang 0.5.12: as 0.5.23 except where the older code differs (mainly: reasoning and content were stripped)."""

from __future__ import annotations

import dataclasses

from engine.serving.base import EditLog, FamilyParser
from engine.serving.emulated.sglang_0_5_12.deepseek import SglangDeepSeekParser0512
from engine.serving.emulated.sglang_0_5_12.glm import SglangGlmParser0512
from engine.serving.emulated.sglang_0_5_12.gpt_oss import SglangGptOssParser0512
from engine.serving.emulated.sglang_0_5_12.kimi_k2 import SglangKimiK2Parser0512
from engine.serving.emulated.sglang_0_5_12.qwen3 import SglangQwen3Parser0512
from engine.serving.emulated.sglang_0_5_23 import SglangEmulation
from engine.types import ParseResult

SERVING_CHAT = "sglang/srt/entrypoints/openai/serving_chat.py"


class Sglang0512Emulation(SglangEmulation):
    version = "0.5.12"
    request_side_package = "engine/parsers/sglang_0_5_12"
    families: dict[str, type[FamilyParser]] = {
        "qwen3": SglangQwen3Parser0512,
        "glm": SglangGlmParser0512,
        "kimi_k2": SglangKimiK2Parser0512,
        "deepseek": SglangDeepSeekParser0512,
        "gpt_oss": SglangGptOssParser0512,
    }

    def served_tools(self, tools: list[dict] | None) -> list[dict] | None:
        """protocol.py:553-581 at 0.5.12: the Function model dumps its fields in their declared order (description,
        name, parameters, strict = false), without the client's key order; the tool keeps `defer_loading: null`."""
        if not tools:
            return None
        served = []
        for tool in tools:
            function = tool.get("function") or {}
            dumped = {"description": function.get("description"), "name": function.get("name"),
                      "parameters": function.get("parameters"), "strict": bool(function.get("strict", False))}
            defer = function.get("defer_loading", tool.get("defer_loading"))
            if defer is not None:
                dumped["defer_loading"] = defer
            served.append({"type": tool.get("type", "function"), "function": dumped,
                           "defer_loading": tool.get("defer_loading")})
        return served

    def serve(self, result: ParseResult, *, tools: list[dict], stream: bool) -> ParseResult:
        if stream or result.content != "":
            return result
        # serving_chat.py:1190 builds the message with content=text if text else None (0.5.23 sends "", 2997).
        log = EditLog(self.origin)
        log.record("empty_content_null", '""', "null", SERVING_CHAT, 1190, None,
                   "an empty answer is sent as content null, not an empty string")
        return dataclasses.replace(result, content=None, edits=result.edits + tuple(log.edits))
