"""One module per model output family; importing this package registers them all."""

from engine.formats import dsml, glm, harmony, kimi_k2, llama3_json, minimax_xml, mistral, qwen3_xml  # noqa: F401
from engine.formats.base import AssistantTurn, Completion, Knobs, ToolCallSpec, get_format  # noqa: F401
