"""One module per model output family; importing this package registers them all."""

from engine.formats import deepseek_v31, dsml, glm, harmony, hermes, kimi_k2, qwen3_xml  # noqa: F401
from engine.formats.base import AssistantTurn, Completion, Knobs, ToolCallSpec, get_format  # noqa: F401
