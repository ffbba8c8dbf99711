"""vLLM 0.33.0 GLM-4.5…5.1 (glm45/glm47): not emulated yet.

Its golden cases in tests/golden/vllm@0.33.0/glm.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class VllmGlmParser(NotEmulated):
    pass
