"""SGLang 0.5.23's BaseReasoningFormatDetector (sglang/srt/parser/reasoning_parser.py:66-364) for <think>/</think>,
which the DeepSeek and GLM reasoning parsers configure (their tool-call start, force_reasoning, whether reasoning
streams). Kimi K2 and Qwen3 keep their own versions: theirs also count what they dropped for their edits."""

from __future__ import annotations

from engine.serving.base import EditLog
from engine.serving.emulated.base import partial_token_length

REASONING = "sglang/srt/parser/reasoning_parser.py"
THINK_START, THINK_END = "<think>", "</think>"


class ReasoningDetector:
    """reasoning_parser.py:66-356 for <think>/</think> with force_reasoning and no continue_final_message."""

    def __init__(self, tool_start: str | None, force_reasoning: bool, stream_reasoning: bool, log: EditLog, *,
                 leading_think_lines: tuple[int, int] = (172, 173),
                 tool_split_lines: tuple[int, int] | None = None) -> None:
        """`tool_start`: the text that also ends reasoning (None: only </think> does). The edits cite
        `leading_think_lines`; a split at `tool_start` is recorded only where `tool_split_lines` is given."""
        self.tool_start = tool_start
        self.in_reasoning = force_reasoning
        self.stream_reasoning = stream_reasoning
        self.log = log
        self.leading_think_lines = leading_think_lines
        self.tool_split_lines = tool_split_lines
        self.buffer = ""
        self.stripped_think_start = False

    def _find_tool_start(self, text: str) -> int:
        return text.find(self.tool_start) if self.tool_start else -1

    def detect_and_parse(self, text: str) -> tuple[str, str]:
        """reasoning_parser.py:160-200: (reasoning, normal) of a whole output."""
        if not (self.in_reasoning or THINK_START in text):
            return "", text
        body = text
        while body.startswith(THINK_START):
            body = body[len(THINK_START) :]
        self.log.record(
            "drop_leading_think", text, body, REASONING, *self.leading_think_lines, "leading <think> tags removed"
        )
        if THINK_END not in body:
            tool_index = self._find_tool_start(body)
            if tool_index != -1:
                if self.tool_split_lines is not None:
                    self.log.record(
                        "tool_call_ends_reasoning",
                        body,
                        body[:tool_index],
                        REASONING,
                        *self.tool_split_lines,
                        f"no </think>: reasoning ends at the first {self.tool_start}, which stays in the content",
                    )
                return body[:tool_index], body[tool_index:]
            return body, ""  # truncated: everything is reasoning
        reasoning, normal = body.split(THINK_END, 1)
        return reasoning, normal

    def stream(self, new_text: str) -> tuple[str, str]:
        """reasoning_parser.py:224-303 _parse_streaming_increment_impl: (reasoning, normal) of one delta."""
        self.buffer += new_text
        current = self.buffer
        watched = [THINK_START, THINK_END] + ([self.tool_start] if self.tool_start else [])
        if any(token.startswith(current) and token != current for token in watched):
            return "", ""
        if not self.stripped_think_start and THINK_START in current:
            current = current.replace(THINK_START, "", 1)
            self.buffer = current
            self.stripped_think_start = True
            self.in_reasoning = True
        if self.in_reasoning and THINK_END in current:
            end = current.find(THINK_END)
            self.buffer = ""
            self.in_reasoning = False
            return current[:end], current[end + len(THINK_END) :]
        if self.in_reasoning:
            tool_index = self._find_tool_start(current)
            if tool_index != -1:
                self.buffer = ""
                self.in_reasoning = False
                return current[:tool_index], current[tool_index:]
            if not self.stream_reasoning:
                return "", ""
            held = [THINK_END] + ([self.tool_start] if self.tool_start else [])
            if not self.stripped_think_start:
                held.append(THINK_START)
            holdback = max(partial_token_length(current, token) for token in held)
            self.buffer = current[len(current) - holdback :]
            return current[: len(current) - holdback], ""
        self.buffer = ""
        return "", current

    def finish(self) -> tuple[str, str]:
        """reasoning_parser.py:336-364: text still held back is flushed (as reasoning inside the block)."""
        if not self.in_reasoning:
            leftover, self.buffer = self.buffer, ""
            return "", leftover
        held = self.buffer.removeprefix(THINK_START)
        self.buffer = ""
        return held, ""
