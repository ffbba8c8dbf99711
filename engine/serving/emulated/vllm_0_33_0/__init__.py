"""vLLM 0.33.0: the Qwen3 parser emulation keyed by vLLM's own CLI names, and the request-side rewrite (also the
stand-in request side of every vLLM release's real code). GLM, Kimi K2, DeepSeek and GPT-OSS run the release's own
code (engine.serving.registry.for_parsers)."""

from __future__ import annotations

import dataclasses
import json

from engine.serving.base import EditLog, EngineEmulation, FamilyParser, RequestPrep
from engine.serving.emulated.vllm_0_33_0.qwen3 import Qwen3EngineParser
from engine.types import ParseResult

REASONING_FAMILY = {"qwen3": "qwen3"}
TOOL_FAMILY = {"qwen3_coder": "qwen3", "qwen3_xml": "qwen3"}
PROTOCOL = "vllm/entrypoints/openai/chat_completion/protocol.py"
ASSEMBLY = "vllm/entrypoints/openai/chat_completion/message_assembly.py"
STREAM = "vllm/entrypoints/openai/chat_completion/stream_processor.py"
CHAT_MESSAGE = "vllm/renderers/chat_utils/chat_message.py"


class VllmEmulation(EngineEmulation):
    name = "vllm"
    version = "0.33.0"
    request_side_package = "engine/parsers/vllm_0_33_0"
    reasoning_parsers = REASONING_FAMILY
    tool_parsers = TOOL_FAMILY
    families: dict[str, type[FamilyParser]] = {
        "qwen3": Qwen3EngineParser,
    }

    def serve(self, result: ParseResult, *, tools: list[dict], stream: bool) -> ParseResult:
        if tools or not result.tool_calls:
            return result
        # keeps_tool_calls is false without declared tools: the parser still extracted the calls (their markup is
        # gone from the content), but the message carries none (message_assembly.py:56-59; streamed deltas lose
        # them in stream_processor.py:84-90).
        log = EditLog(self.origin)
        log.record("drop_calls_without_tools", "".join(f"{c.name}({c.arguments})" for c in result.tool_calls), "",
                   STREAM if stream else ASSEMBLY, 84 if stream else 56, 90 if stream else 59,
                   "the request declares no tools: parsed calls are dropped, their markup is already gone from the "
                   "content")
        return dataclasses.replace(result, tool_calls=(), edits=result.edits + tuple(log.edits))

    def prepare_request(self, messages: list[dict], tools: list[dict] | None) -> RequestPrep:
        log = EditLog(self.origin)
        prepared = self._copy(messages)
        for index, message in enumerate(prepared):
            if message.get("role") != "assistant":
                continue
            if "reasoning_content" in message:
                legacy = message.pop("reasoning_content")
                if message.get("reasoning") is None:
                    message["reasoning"] = legacy
                log.record(
                    "rename_reasoning_content",
                    f"messages[{index}].reasoning_content",
                    f"messages[{index}].reasoning",
                    PROTOCOL,
                    584,
                    600,
                    "reasoning_content is renamed to reasoning (kept only if reasoning is absent)",
                )
            if message.get("reasoning") is not None:
                message["reasoning_content"] = message["reasoning"]
                log.record(
                    "reasoning_both_fields",
                    f"messages[{index}].reasoning",
                    f"messages[{index}].reasoning + reasoning_content",
                    CHAT_MESSAGE,
                    619,
                    660,
                    "the template receives the reasoning under both names",
                )
            if "tool_calls" in message and not message["tool_calls"]:
                del message["tool_calls"]
                log.record(
                    "drop_empty_tool_calls",
                    f"messages[{index}].tool_calls=[]",
                    "",
                    CHAT_MESSAGE,
                    699,
                    771,
                    "an empty tool_calls list is dropped",
                )
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                arguments = function.get("arguments")
                if not isinstance(arguments, str):
                    continue
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    parsed = None
                if not isinstance(parsed, dict):
                    log.record(
                        "args_invalid_to_empty",
                        arguments,
                        "{}",
                        CHAT_MESSAGE,
                        699,
                        771,
                        "arguments that are not a JSON object become {} (warning)",
                    )
                    parsed = {}
                else:
                    log.record(
                        "args_json_loads",
                        arguments,
                        json.dumps(parsed, ensure_ascii=False),
                        CHAT_MESSAGE,
                        699,
                        771,
                        "arguments string parsed into a dict; the template re-serialises it",
                    )
                function["arguments"] = parsed
        return RequestPrep(prepared, tuple(log.edits), None)
