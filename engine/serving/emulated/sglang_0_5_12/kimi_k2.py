"""SGLang 0.5.12 Kimi K2.x (kimi_k2): the same chain as 0.5.23 except where this module says otherwise.

- Reasoning (reasoning_parser.py:62-108 non-streaming, 111-175 streaming): the non-streaming split removes every
  `<think>` and strips the whole output, the reasoning before a tool section and the answer; streaming rstrips the
  reasoning that arrives in the same chunk as `</think>`; there is no finish(), so a held-back partial marker is lost.
- Non-streaming calls keep the model's `:N` as their index (kimik2_detector.py:176-190), and the serving layer builds
  the id from it (serving_chat.py:1274-1292, 1322-1323); when no call parses, the whole text stays content
  (function_call_parser.py:124-131).
- Streaming (kimik2_detector.py:199-322) re-searches the whole buffer with a regex on every chunk, treats a call as
  finished as soon as its arguments are complete JSON, and returns no text while a tool marker is buffered.
"""

from __future__ import annotations

import json

from engine.serving.base import EditLog
from engine.serving.emulated.sglang_0_5_23.kimi_k2 import (
    CALL_END,
    CALL_START,
    DETECTOR,
    LINES,
    REASONING,
    SECTION_START,
    SERVING,
    THINK_END,
    THINK_START,
    DetectorFailure,
    Growing,
    Head,
    JsonPrefix,
    KimiReasoning,
    KimiToolStream,
    SglangKimiK2Parser,
    orjson_accepts,
    strip_tool_tokens,
)

LINES_0512 = {
    **LINES,
    "drop_think_start": (REASONING, 136, 140),
    "args_ws_trim": (DETECTOR, 65, 68),
    "drop_unrecognized_call": (DETECTOR, 176, 183),
    "content_before_section": (DETECTOR, 192, 193),
    "strip_tool_tokens": (DETECTOR, 27, 31),
    "drop_buffer_on_error": (DETECTOR, 320, 322),
    "drop_unflushed_buffer": (DETECTOR, 205, 237),
    "tool_detector_stream": (DETECTOR, 199, 322),
    "args_unstreamed_tail": (SERVING, 1690, 1698),
    "reasoning_strip": (REASONING, 73, 75),
    "reasoning_before_tool_strip": (REASONING, 89, 89),
    "content_strip": (REASONING, 102, 102),
    "reasoning_rstrip_at_end": (REASONING, 152, 154),
    "drop_unflushed_reasoning_buffer": (REASONING, 126, 134),
    "drop_buffer_without_marker": (DETECTOR, 208, 216),
    "drop_text_before_call": (DETECTOR, 299, 309),
}


class KimiReasoning0512(KimiReasoning):
    """BaseReasoningFormatDetector as of 0.5.12 (reasoning_parser.py:62-175)."""

    def __init__(self, force_reasoning: bool, parser: SglangKimiK2Parser) -> None:
        super().__init__(force_reasoning, parser)
        self.rstripped = ""  # whitespace the end-of-reasoning rstrip removed

    def parse_whole(self, text: str, log: EditLog) -> tuple[str, str]:
        if not (self.in_reasoning or THINK_START in text):
            return "", text
        processed = text.replace(THINK_START, "").strip()
        self.parser.record(log, "reasoning_strip", text, processed, "text.replace('<think>', '').strip()")
        if THINK_END not in processed:
            tool = processed.find(SECTION_START)
            if tool != -1:
                reasoning = processed[:tool].strip()
                self.parser.record(
                    log, "reasoning_before_tool_strip", processed[:tool], reasoning, "reasoning_text.strip()"
                )
                return reasoning, processed[tool:]
            return processed, ""
        reasoning, normal = processed.split(THINK_END, 1)
        self.parser.record(log, "content_strip", normal, normal.strip(), "normal_text = splits[1].strip()")
        return reasoning, normal.strip()

    def feed(self, new_text: str) -> tuple[str, str]:
        if not self.buffer and "<" not in new_text:  # every marker starts with "<": nothing to hold or cut
            return (new_text, "") if self.in_reasoning else ("", new_text)
        self.buffer += new_text
        current = self.buffer
        if any(t.startswith(current) and t != current for t in (THINK_START, THINK_END, SECTION_START)):
            return "", ""
        if not self.stripped_think_start and THINK_START in current:
            current = current.replace(THINK_START, "", 1)  # not written back to the buffer in this version
            self.dropped_think += THINK_START
            self.stripped_think_start = True
            self.in_reasoning = True
        if self.in_reasoning and THINK_END in current:
            end = current.find(THINK_END)
            self.buffer = ""
            self.in_reasoning = False
            self.rstripped += current[:end][len(current[:end].rstrip()) :]
            return current[:end].rstrip(), current[end + len(THINK_END) :]
        if self.in_reasoning:
            tool = current.find(SECTION_START)
            if tool != -1:
                self.buffer = ""
                self.in_reasoning = False
                return current[:tool], current[tool:]
            self.buffer = ""
            return current, ""
        self.buffer = ""
        return "", current


class KimiToolStream0512(KimiToolStream):
    """KimiK2Detector.parse_streaming_increment as of 0.5.12 (kimik2_detector.py:199-322)."""

    def __init__(self, parser: SglangKimiK2Parser, tools: list[dict]) -> None:
        super().__init__(parser, tools)
        self.reset_head()
        self.name_sent = False

    def reset_head(self) -> None:
        self.head: Head | None = None
        self.head_from = 0
        self.complete = JsonPrefix()  # _is_complete_json on the arguments before the first end marker
        self.complete_fed = 0
        self.inference = JsonPrefix()  # the greedy `\{.*` the name inference reads
        self.inference_fed = 0
        self.diff_end: tuple[int, int] = (-1, -1)  # (search start, end marker found from there)
        self.complete_verdict: bool | None = None

    def find_head(self) -> Head | None:
        """stream_tool_call_portion_regex.search: the first call begin whose header is complete up to '{'."""
        while True:
            if self.head is None:
                start = self.buffer.find(CALL_START, self.head_from)
                if start == -1:
                    return None
                self.head = Head(start)
            if self.head.status == "pending":
                self.head.advance(self.buffer.slice(self.head.position), self.head.position, final=False)
            if self.head.status == "matched":
                return self.head
            if self.head.status == "pending":
                return None
            self.head_from, self.head = self.head.start + 1, None

    def feed(self, new_text: str) -> tuple[str, list]:
        previous = self.buffer.length
        self.buffer.append(new_text)
        if self.buffer.find(SECTION_START) == -1 and self.buffer.find(CALL_START) == -1:
            self.drop(
                "drop_buffer_without_marker",
                strip_tool_tokens(self.buffer.slice(0, previous)),
                "the buffer is cleared and only the new text is returned",
            )
            self.buffer = Growing()
            self.reset_head()
            return self.emit(new_text), []
        try:
            return "", self.step()
        except DetectorFailure:
            return self.emit(self.buffer.text()), []  # the buffer stays, so the text comes back again

    def step(self) -> list:
        head = self.find_head()
        if head is None:
            return []
        buffer = self.buffer
        name = self.name
        if name is None:  # the name is read again on every chunk until it resolves; the arguments only then
            if self.inference_fed < buffer.length - head.brace:
                self.inference.extend(buffer.slice(head.brace + self.inference_fed))
                self.inference_fed = buffer.length - head.brace
            call_id = buffer.slice(head.id_start, head.id_end)
            name = self.parser.parse_call_id(call_id, self.tools, self.inference)[0]
        if name is None:
            return []
        if self.current_tool_id == -1:
            self.current_tool_id = 0
            self.prev_tool_call_arr = []
            self.streamed_args = [[]]
        while len(self.prev_tool_call_arr) <= self.current_tool_id:
            self.prev_tool_call_arr.append({})
        while len(self.streamed_args) <= self.current_tool_id:
            self.streamed_args.append([])
        if not self.name_sent:
            self.name_sent = True
            self.name = name
            self.prev_tool_call_arr[self.current_tool_id] = {"name": name, "arguments": {}}
            return [(self.current_tool_id, name, "")]
        calls = []
        diff_start = head.brace + self.last_length
        if self.diff_end[0] != diff_start or self.diff_end[1] == -1:
            found = buffer.slice(diff_start).find(CALL_END)
            self.diff_end = (diff_start, diff_start + found if found != -1 else -1)
        stop = self.diff_end[1] if self.diff_end[1] != -1 else buffer.length
        parsed_diff = buffer.slice(diff_start, stop)
        if parsed_diff:
            calls.append((self.current_tool_id, None, parsed_diff))
            self.last_length += len(parsed_diff)
            self.streamed_args[self.current_tool_id].append(parsed_diff)
        end = buffer.find(CALL_END, head.brace)
        stop = end if end != -1 else buffer.length
        if stop > head.brace + self.complete_fed:
            self.complete.extend(buffer.slice(head.brace + self.complete_fed, stop))
            self.complete_fed = stop - head.brace
        if self.complete.kind != "closed":
            return calls
        if self.complete_verdict is None:  # only whitespace can follow a closed value, which keeps the verdict
            self.complete_verdict = orjson_accepts(self.complete.text())
        if not self.complete_verdict:
            return calls
        try:
            self.prev_tool_call_arr[self.current_tool_id]["arguments"] = json.loads(self.complete.text())
        except json.JSONDecodeError:
            pass
        except (ValueError, RecursionError) as error:  # escapes to the detector's catch-all (320-322)
            raise DetectorFailure(str(error)) from error
        first = buffer.find(CALL_START)
        close = buffer.find(CALL_END, first + len(CALL_START)) if first != -1 else -1
        self.drop(
            "drop_text_before_call",
            strip_tool_tokens(buffer.slice(0, head.start)),
            "text buffered before the call is never returned",
        )
        self.buffer = Growing(buffer.slice(close + len(CALL_END))) if close != -1 else Growing()
        self.current_tool_id += 1
        self.last_length = 0
        self.name_sent = False
        self.name = None
        self.reset_head()
        return calls

    def unstreamed_arguments(self) -> tuple[int, str] | None:
        """_check_for_unstreamed_tool_args as of 0.5.12 (serving_chat.py:1656-1710): replace, not startswith."""
        if not self.prev_tool_call_arr or not self.streamed_args:
            return None
        index = len(self.prev_tool_call_arr) - 1
        if index < 0 or index >= len(self.streamed_args):
            return None
        expected = json.dumps(self.prev_tool_call_arr[index].get("arguments", {}), ensure_ascii=False)
        actual = "".join(self.streamed_args[index])
        remaining = expected.replace(actual, "", 1) if actual in expected else ""
        return (index, remaining) if remaining else None


class SglangKimiK2Parser0512(SglangKimiK2Parser):
    """The 0.5.23 chain with 0.5.12's reasoning detector, tool stream, call numbering and no-call fallback.

    The conformance glue numbers non-streaming ids by position for both versions; this follows 0.5.12's serving
    code (the model's `:N`). The golden cases cannot tell them apart: every one has N equal to the position."""

    merged_properties = False  # params.get("properties", {}) (kimik2_detector.py:142)
    has_stream_end = False  # neither parse_stream_end exists yet
    lines = LINES_0512

    def reasoning_detector(self) -> KimiReasoning:
        return KimiReasoning0512(self.force_reasoning(), self)

    def tool_stream(self, tools: list[dict]) -> KimiToolStream:
        return KimiToolStream0512(self, tools)

    def call_index(self, local_index: int, model_index: int) -> int:
        return model_index

    def after_parse(self, text: str, normal: str, items: list, log: EditLog) -> str:
        if not items:
            return text
        return super().after_parse(text, normal, items, log)

    def record_reasoning_stream(self, log: EditLog, reasoner: KimiReasoning) -> None:
        super().record_reasoning_stream(log, reasoner)
        if isinstance(reasoner, KimiReasoning0512):
            self.record(
                log,
                "reasoning_rstrip_at_end",
                reasoner.rstripped,
                "",
                "reasoning arriving in the chunk of </think> is rstripped",
            )
        self.record(
            log,
            "drop_unflushed_reasoning_buffer",
            reasoner.buffer,
            "",
            "a held-back partial marker is lost: this version has no finish() to release it",
        )
