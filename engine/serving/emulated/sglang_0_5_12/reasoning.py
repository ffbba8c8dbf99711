"""SGLang 0.5.12's BaseReasoningFormatDetector (reasoning_parser.py:19-181): 0.5.23's except that a whole output
is `.replace("<think>", "").strip()`-ed and its answer `.strip()`-ed, reasoning cut at the tool-call start is
stripped, streaming rstrips the reasoning of the delta that holds </think>, the stripped <think> is not written back
to the buffer, and nothing is held back at the end of a delta."""

from __future__ import annotations

from engine.serving.emulated.sglang_0_5_23.reasoning import REASONING, THINK_END, THINK_START, ReasoningDetector


class ReasoningDetector0512(ReasoningDetector):
    def detect_and_parse(self, text: str) -> tuple[str, str]:
        if not (self.in_reasoning or THINK_START in text):
            return "", text
        body = text.replace(THINK_START, "").strip()
        self.log.record("reasoning_strip", text, body, REASONING, 73, 75, "text.replace('<think>', '').strip()")
        if THINK_END not in body:
            tool_index = self._find_tool_start(body)
            if tool_index != -1:
                reasoning = body[:tool_index].strip()
                if self.tool_split_lines is not None:
                    self.log.record(
                        "tool_call_ends_reasoning",
                        body,
                        reasoning,
                        REASONING,
                        *self.tool_split_lines,
                        f"no </think>: reasoning ends at the first {self.tool_start} and is stripped; the call stays"
                        " in content",
                    )
                return reasoning, body[tool_index:]
            return body, ""
        reasoning, normal = body.split(THINK_END, 1)
        stripped = normal.strip()
        self.log.record("content_strip", normal, stripped, REASONING, 102, 102, "normal_text = splits[1].strip()")
        return reasoning, stripped

    def stream(self, new_text: str) -> tuple[str, str]:
        self.buffer += new_text
        current = self.buffer
        watched = [THINK_START, THINK_END] + ([self.tool_start] if self.tool_start else [])
        if any(token.startswith(current) and token != current for token in watched):
            return "", ""
        if not self.stripped_think_start and THINK_START in current:
            current = current.replace(THINK_START, "", 1)
            self.stripped_think_start = True
            self.in_reasoning = True
        if self.in_reasoning and THINK_END in current:
            end = current.find(THINK_END)
            self.buffer = ""
            self.in_reasoning = False
            reasoning = current[:end]
            self.log.record(
                "reasoning_rstrip", reasoning, reasoning.rstrip(), REASONING, 153, 153, "reasoning_text.rstrip()"
            )
            return reasoning.rstrip(), current[end + len(THINK_END) :]
        if self.in_reasoning:
            tool_index = self._find_tool_start(current)
            if tool_index != -1:
                self.buffer = ""
                self.in_reasoning = False
                return current[:tool_index], current[tool_index:]
            if not self.stream_reasoning:
                return "", ""
            self.buffer = ""
            return current, ""
        self.buffer = ""
        return "", current
