"""The tool-call ids a client sends back: what the engine returned, with its random ids made stable and distinct.

A real server gives every call a fresh random id (SGLang `call_` + 24 hex digits, serving_chat.py
`_process_tool_call_id`; vLLM `chatcmpl-tool-` + 16 from 0.12.0, 32 before, chat_utils/tool_call.py
`make_tool_call_id`), which the client echoes in the assistant message and its tool results. The emulations return
such an id as a placeholder (`call_<uuid>`), the real backend returns the release's random value; a cell must neither
show the same placeholder for every call (a renderer that checks ids, deepseek-recipe, refuses duplicates) nor change
between runs (the ids' tokens count in the prefix figures). So each random id becomes one derived from the call's
position in the session, of the same shape (prefix and number of hex digits): distinct per call, the same in every
run.

What the engine does not randomise is kept as it returned it: Kimi's `functions.name:N` numbering (repeats
included), an id the model wrote, and a missing id (the client names it then, OutputFormat.client_call_id). A real
release that returns one random id for two calls keeps the two equal.

    ids = SessionCallIds()
    ids.client_id("call_<uuid>", 0)   # -> "call_" + 24 hex digits, the same for position 0 in every session

A logged trace has the ids the real server drew; its replay sends those back instead (engine/traces/pipeline.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RandomIdShape:
    """One engine's random call id: `prefix` and `digits` lowercase hex digits (or the emulations' `<uuid>`)."""

    prefix: str
    digits: int

    def matches(self, call_id: str) -> bool:
        return re.fullmatch(re.escape(self.prefix) + f"(?:<uuid>|[0-9a-f]{{{self.digits}}})", call_id) is not None

    def at(self, position: int) -> str:
        """The id of the session's `position`-th call (0-based), in this shape."""
        return self.prefix + hashlib.sha256(f"tool call {position}".encode()).hexdigest()[:self.digits]


# vLLM's is 32 digits up to 0.11, 16 from 0.12.0 (vllm/utils random_uuid); the emulated vLLM release is 0.33.0, so
# its placeholder takes the first shape of its prefix, 16 digits.
RANDOM_ID_SHAPES = (RandomIdShape("call_", 24), RandomIdShape("chatcmpl-tool-", 16),
                    RandomIdShape("chatcmpl-tool-", 32))


def random_shape(call_id: str) -> RandomIdShape | None:
    """The shape of an engine's random id that `call_id` has (its placeholder included), or None."""
    return next((shape for shape in RANDOM_ID_SHAPES if shape.matches(call_id)), None)


@dataclass
class SessionCallIds:
    """The ids of one session's calls, in order; a real random id seen again maps to the same stable id."""

    _given: dict[str, str] = field(default_factory=dict)

    def client_id(self, engine_id: str, position: int) -> str:
        shape = random_shape(engine_id)
        if shape is None:
            return engine_id
        if engine_id.endswith("<uuid>"):  # an emulation's placeholder stands for a fresh random value
            return shape.at(position)
        return self._given.setdefault(engine_id, shape.at(position))
