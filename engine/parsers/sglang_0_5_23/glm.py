"""SGLang 0.5.23 GLM-4.5…5.1 (glm45/glm47): not emulated yet.

Its golden cases in tests/golden/sglang@0.5.23/glm.json are strict xfails until it is."""

from __future__ import annotations

from engine.parsers.base import NotEmulated


class SglangGlmParser(NotEmulated):
    pass
