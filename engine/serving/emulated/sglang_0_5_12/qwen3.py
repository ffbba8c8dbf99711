"""SGLang 0.5.12 Qwen3: the non-streaming reasoning parser strips the whole output and the answer; <tool_call> does not
end reasoning (no tool_call_parser_active yet)."""

from __future__ import annotations

from engine.serving.base import EditLog
from engine.serving.emulated.sglang_0_5_23.qwen3 import REASONING, SglangQwen3Parser


class SglangQwen3Parser0512(SglangQwen3Parser):
    tool_call_ends_reasoning = False
    unparsed_markup_kept = True
    # 0.5.12's qwen3_coder_detector.py is 0.5.23's six lines earlier (the real code's executed lines show it)
    coder_lines = {"trim": (209, 213), "dump": 223, "content": 232}

    def prestrip(self, text: str, stream: bool, log: EditLog) -> str:
        if stream:
            return text
        stripped = text.replace("<think>", "").strip()
        log.record("reasoning_strip", text, stripped, REASONING, 73, 75, "text.replace('<think>', '').strip()")
        return stripped

    def strip_content(self, rest: str, stream: bool, log: EditLog) -> str:
        if stream:
            return rest
        stripped = rest.strip()
        log.record("content_strip", rest, stripped, REASONING, 102, 102, "normal_text = splits[1].strip()")
        return stripped
