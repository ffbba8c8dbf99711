"""One module per model output family; importing this package registers them all."""

from __future__ import annotations

from engine.formats import (  # noqa: F401
    deepseek_v31,
    dsml,
    glm,
    harmony,
    hermes,
    kimi_k2,
    llama3_json,
    minimax_xml,
    mistral,
    qwen3_xml,
)
from engine.formats.base import (  # noqa: F401
    AssistantTurn,
    Completion,
    Knobs,
    ToolCallSpec,
    get_format,
    registered_formats,
)
