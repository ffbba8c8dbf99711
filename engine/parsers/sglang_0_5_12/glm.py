"""SGLang 0.5.12 GLM-4.5…5.1 (glm45/glm47).

The same code as 0.5.23 for this family unless this module says otherwise."""

from __future__ import annotations

from engine.parsers.sglang_0_5_23.glm import SglangGlmParser


class SglangGlmParser0512(SglangGlmParser):
    pass
