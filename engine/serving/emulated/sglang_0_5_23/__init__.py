"""SGLang 0.5.23: parser emulations keyed by SGLang's own CLI names, and the request-side rewrite."""

from __future__ import annotations

import json
from typing import Any

from engine.serving.base import EditLog, EngineEmulation, FamilyParser, RequestPrep
from engine.serving.emulated.sglang_0_5_23 import deepseek_recipe
from engine.serving.emulated.sglang_0_5_23.deepseek import SglangDeepSeekParser
from engine.serving.emulated.sglang_0_5_23.glm import SglangGlmParser
from engine.serving.emulated.sglang_0_5_23.gpt_oss import SglangGptOssParser
from engine.serving.emulated.sglang_0_5_23.kimi_k2 import SglangKimiK2Parser
from engine.serving.emulated.sglang_0_5_23.qwen3 import SglangQwen3Parser
from engine.types import ParseResult

REASONING_FAMILY = {
    "qwen3": "qwen3",
    "glm45": "glm",
    "kimi_k2": "kimi_k2",
    "deepseek-v3": "deepseek",
    "deepseek-v4": "deepseek",
    "gpt-oss": "gpt_oss",
}
TOOL_FAMILY = {
    "qwen3_coder": "qwen3",
    "qwen": "qwen3",
    "glm45": "glm",
    "glm47": "glm",
    "kimi_k2": "kimi_k2",
    "deepseekv3": "deepseek",
    "deepseekv31": "deepseek",
    "deepseekv32": "deepseek",
    "deepseekv4": "deepseek",
    "gpt-oss": "gpt_oss",
}
SERVING_CHAT = "sglang/srt/entrypoints/openai/serving_chat.py"


class SglangEmulation(EngineEmulation):
    name = "sglang"
    version = "0.5.23"
    request_side_package = "engine/parsers/sglang_0_5_23"
    reasoning_parsers = REASONING_FAMILY
    tool_parsers = TOOL_FAMILY
    families: dict[str, type[FamilyParser]] = {
        "qwen3": SglangQwen3Parser,
        "glm": SglangGlmParser,
        "kimi_k2": SglangKimiK2Parser,
        "deepseek": SglangDeepSeekParser,
        "gpt_oss": SglangGptOssParser,
    }

    def asks_release(self, reasoning_parser: str | None, tool_parser: str | None) -> bool:
        return deepseek_recipe.owns(self.version, tool_parser)

    def parse(self, text: str, *, reasoning_parser: str | None, tool_parser: str | None,
              tools: list[dict] | None = None, stream: bool = False, chunks: list[str] | None = None,
              chat_template_kwargs: dict | None = None, history_tool_calls: int = 0,
              tokenizer: Any = None) -> ParseResult:
        if deepseek_recipe.owns(self.version, tool_parser):  # the release's own code (deepseek_recipe.py)
            self.check_names(reasoning_parser, tool_parser)
            return deepseek_recipe.parse(text, reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools,
                                         stream=stream, chunks=chunks, chat_template_kwargs=chat_template_kwargs,
                                         history_tool_calls=history_tool_calls, tokenizer=tokenizer)
        return super().parse(text, reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools,
                             stream=stream, chunks=chunks, chat_template_kwargs=chat_template_kwargs,
                             history_tool_calls=history_tool_calls, tokenizer=tokenizer)

    def output_text(self, text: str, stop_token: str | None, tool_parser: str | None) -> str:
        # detokenizer_manager.py:218-220 keeps <|call|> (id 200012) when the tool parser is gpt-oss: the detector
        # needs it to close a call.
        if stop_token == "<|call|>" and tool_parser == "gpt-oss":
            return text
        return super().output_text(text, stop_token, tool_parser)

    def served_tools(self, tools: list[dict] | None) -> list[dict] | None:
        """The tools as the template receives them: `[item.model_dump() for item in request.tools]`
        (serving_chat.py `_process_messages`) of protocol.py's Tool / Function models (810-855): unknown keys
        dropped, the function's keys in the client's order (None-valued strict and defer_loading left out, a missing
        description or parameters as null at the end), the tool's own `defer_loading: null` kept."""
        if not tools:
            return None
        served = []
        for tool in tools:
            function = dict(tool.get("function") or {})
            fields = {"description": function.get("description"), "name": function.get("name"),
                      "parameters": function.get("parameters"), "strict": function.get("strict"),
                      "defer_loading": function.get("defer_loading", tool.get("defer_loading"))}
            dumped = {k: v for k, v in fields.items() if not (k in ("strict", "defer_loading") and v is None)}
            order = [k for k in function if k in dumped]
            served.append({"type": tool.get("type", "function"),
                           "function": {k: dumped[k] for k in order + [k for k in dumped if k not in order]},
                           "defer_loading": tool.get("defer_loading")})
        return served

    def prepare_request(self, messages: list[dict], tools: list[dict] | None) -> RequestPrep:
        log = EditLog(self.origin)
        prepared = self._copy(messages)
        for index, message in enumerate(prepared):
            for call in message.get("tool_calls") or []:
                arguments = call.get("function", {}).get("arguments")
                if not isinstance(arguments, str):
                    continue
                try:
                    parsed = json.loads(arguments)
                except ValueError as exc:
                    return RequestPrep(
                        prepared, tuple(log.edits), f"messages[{index}]: tool call arguments are not valid JSON ({exc})"
                    )
                if not isinstance(parsed, dict):
                    return RequestPrep(
                        prepared, tuple(log.edits), f"messages[{index}]: tool call arguments must be a JSON object"
                    )
                call["function"]["arguments"] = parsed
                log.record(
                    "args_orjson_loads",
                    arguments,
                    json.dumps(parsed, ensure_ascii=False),
                    SERVING_CHAT,
                    181,
                    194,
                    "arguments string parsed (orjson) into a dict before rendering",
                )
        return RequestPrep(prepared, tuple(log.edits), None, tools=self.served_tools(tools))
