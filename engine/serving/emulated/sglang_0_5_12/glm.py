"""SGLang 0.5.12 GLM-4.5 … 5.1 (glm45/glm47): the 0.5.23 chain except where the older code differs.

- Reasoning (reasoning_parser.py:62-181, Glm45Detector 334-364): non-streaming removes every `<think>` and strips the
  whole output, the reasoning cut at a `<tool_call>`, and the answer; streaming rstrips the reasoning at `</think>`,
  holds nothing back at the end of a delta and has no end-of-stream flush.
- FunctionCallParser.parse_non_stream (function_call_parser.py:112-131) returns the whole text when no call parses.
- Glm4MoeDetector (glm4_moe_detector.py): no quote stripping for string values, no `[T, null]` type unions, the name
  is sent in a delta of its own, and a call without arguments streams "{}" that is not counted as streamed.
- Glm47MoeDetector (glm47_moe_detector.py): the GLM-4.5 argument rules (type from the schema or "string", values
  parsed by json.loads / literal_eval, numbers streamed raw), no schema-union logic, and the closing brace is skipped
  when the streamed arguments already end in "}".
"""

from __future__ import annotations

from typing import Any

from engine.serving.emulated.sglang_0_5_12.reasoning import ReasoningDetector0512
from engine.serving.emulated.sglang_0_5_23.glm import (
    CallItem,
    Glm4Detector,
    Glm47Detector,
    GlmDetectorBase,
    SglangGlmParser,
    functions,
    infer_type,
)


def argument_type_0512(tools: list[dict], name: str, key: str) -> str | None:
    """get_argument_type at 0.5.12 (glm4_moe_detector.py:30-62, glm47_moe_detector.py:30-73): only the top-level
    `properties` are read, and a `[T, null]` union is not resolved."""
    by_name = dict(functions(tools))
    if name not in by_name or not isinstance(by_name[name], dict):
        return None
    properties = by_name[name].get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get(key), dict):
        return None
    return infer_type(properties[key], optional_unions=False)


class Glm4Detector0512(Glm4Detector):
    optional_unions = False
    unquotes_strings = False
    args_with_name = False  # 497-513: the delta that sends the name streams no arguments
    lines = {"stray_eot": (450, 451), "content": (193, 194), "no_newline": (202, 204), "args": (83, 131)}

    def argument_type(self, name: str, key: str) -> str | None:
        return argument_type_0512(self.tools, name, key)

    def close_object(self) -> list[CallItem]:
        """544-567: "{}" for a call without arguments (not added to streamed_args_for_tool), else "}" unless the
        streamed arguments already end in one."""
        index = self.current_tool_id
        if self.is_first_param:
            self.last_arguments.append("{}")
            return [CallItem(index, None, "{}")]
        if self.last_arguments.value.endswith("}"):
            return []
        self.last_arguments.append("}")
        self.streamed_args_for_tool[index].append("}")
        return [CallItem(index, None, "}")]


class Glm47Detector0512(Glm47Detector):
    optional_unions = False
    lines = {"stray_eot": (649, 650), "content": (203, 219), "args": (94, 142)}

    def argument_type(self, name: str, key: str, arguments: dict | None = None) -> str | None:
        return argument_type_0512(self.tools, name, key)

    unquotes_strings = False

    def parse_value(self, raw: str, arg_type: str | None) -> tuple[Any, bool]:
        """parse_arguments (94-142): the GLM-4.5 strategies, numbers coerced only for "number"."""
        return Glm4Detector.parse_value(self, raw, arg_type)

    def parse_pairs(self, pairs: list[tuple[str, str]], name: str) -> dict:
        """_parse_argument_pairs (746-781), the same rules as Glm4MoeDetector."""
        return Glm4Detector.parse_pairs(self, pairs, name)

    def needs_context(self, name: str) -> bool:
        return False  # no schema-union handling and no buffered arguments before 0.5.13

    def value_type(self, name: str, key: str) -> str:
        return Glm4Detector.value_type(self, name, key)

    def format_complete(self, value: str, value_type: str) -> str:
        return Glm4Detector.format_complete(self, value, value_type)

    def close_value(self, final_value: str, name: str) -> str:
        return GlmDetectorBase.close_value(self, final_value, name)

    def stream_value(self, content: str) -> str:
        return GlmDetectorBase.stream_value(self, content)

    def closing_text(self) -> str:
        """569-593."""
        if self.sent_empty_object:
            return ""
        if self.is_first_param:
            return "{}"
        return "" if self.last_arguments.value.endswith("}") else "}"


class SglangGlmParser0512(SglangGlmParser):
    reasoning_class = ReasoningDetector0512
    reasoning_lines = {**SglangGlmParser.reasoning_lines, "tool_split": (82, 94)}
    detectors: dict[str, type[GlmDetectorBase]] = {"glm45": Glm4Detector0512, "glm47": Glm47Detector0512}
    flushes_at_end = False
    keeps_text_without_calls = True  # function_call_parser.py:128-131: the whole text when no call parses
    unstreamed_lines = (1656, 1727)
