"""Inside an engine's worker only: DeepSeek V3.2's Python encoder (`encoding_dsv32.py`, as an SGLang release bundles
it) run with provenance and with its constructs undone, over the arguments the release's serving code gave it.

SGLang started with `--tool-call-parser deepseekv32` (or serving a DeepseekV3 architecture without a chat template)
renders through that encoder, not a Jinja template: `encode_messages(messages, thinking_mode)` renders each message
with `render_message(index, messages, thinking_mode)`, one message per index (V3.2 merges nothing; dropping earlier
reasoning in thinking mode keeps every message), so the encoder's message `index` is the request's message through
`origin` (the serving code's inserted system message, which hosts the tools, is -1).

Provenance: while the encoder runs, a line tracer watches the local `prompt` of `render_message` and
`encode_messages`; what each statement appends belongs to the message being rendered (BOS and what
`encode_messages` adds itself are scaffolding, -1) and to that line. The engine's encoder module is the one the
release imported; nothing is copied.
"""

from __future__ import annotations

from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from engine.render.constructs import Evaluation, InstrumentedModule
from engine.render.deepseek_v4 import rendered_message, run_watching_prompt

TRACED_FUNCTIONS = frozenset({"render_message", "encode_messages"})
REPRINTING_FUNCTIONS = frozenset({"to_json"})  # the encoder's functions that print a value anew


class DeepSeekV32Encoder:
    """`request`: {"messages": the encoder's arguments, "origin": each one's request index (-1 inserted),
    "thinking_mode", "drop_thinking"}."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module
        self._file = str(Path(module.__file__).resolve())
        self._instrumented_module: InstrumentedModule | None = None

    def _encode(self, request: dict, encode: Any = None) -> str:
        return (encode or self._module.encode_messages)(
            request["messages"], thinking_mode=request["thinking_mode"], drop_thinking=request["drop_thinking"])

    def provenance(self, prompt: str, request: dict) -> tuple[list[int], list[int]]:
        """Each character's request message (-1 scaffolding) and encoder line; ValueError when the traced run does not
        give `prompt`."""
        origin = request["origin"]
        index: list[int] = []
        lines: list[int] = []

        def record_growth(frame: FrameType, grown: str, seen: int, line: int) -> None:
            appended = len(grown) - seen
            if frame.f_code.co_name == "encode_messages":
                if len(index) >= len(grown):
                    return  # render_message's output, already recorded statement by statement inside it
                owner = -1
            else:
                at = frame.f_locals.get("index")
                owner = origin[at] if isinstance(at, int) and 0 <= at < len(origin) else -1
            index.extend([owner] * appended)
            lines.extend([line] * appended)

        traced = run_watching_prompt(self._file, TRACED_FUNCTIONS, record_growth, lambda: self._encode(request))
        if traced != prompt or len(index) != len(prompt):
            raise ValueError(f"the traced run of {Path(self._file).name} followed {len(index)} of {len(prompt)} "
                             "characters of the prompt")
        return index, lines

    def counterfactual(self, request: dict, *, undo_from: int | None, undo: frozenset[int],
                       substitute: dict[int, dict[str, str]]) -> tuple[str, list[Evaluation]]:
        """The prompt with those encoder constructs undone from request message `undo_from` on, and the evaluations
        (engine.render.constructs; construct ids of the encoder's own source)."""
        if self._instrumented_module is None:
            self._instrumented_module = InstrumentedModule(
                Path(self._file).read_text(encoding="utf-8"), self._file, REPRINTING_FUNCTIONS, rendered_message)
        module = self._instrumented_module
        owners = dict(enumerate(request["origin"]))
        return module.run(lambda: self._encode(request, module.namespace["encode_messages"]), owners,
                          undo_from=undo_from, undo=undo, substitute=substitute)
