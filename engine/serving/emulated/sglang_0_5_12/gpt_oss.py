"""SGLang 0.5.12 GPT-OSS harmony: the same harmony parser and detectors as 0.5.23 (harmony_parser.py and
gpt_oss_detector.py are identical); FunctionCallParser.parse_non_stream differs."""

from __future__ import annotations

from engine.serving.emulated.sglang_0_5_23.gpt_oss import SglangGptOssParser


class SglangGptOssParser0512(SglangGptOssParser):
    # function_call_parser.py:128-131: with no call parsed the whole text comes back, call markup included
    # (an undeclared tool, invalid JSON arguments or a call cut off by the length limit stay visible as content)
    keeps_text_without_calls = True
    end_flush = "0.5.12 has no stream-end flush at all (no parse_stream_end)"
