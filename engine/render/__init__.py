"""Renderers: messages -> prompt text with per-character provenance (see engine.types.Rendered)."""

from __future__ import annotations

from typing import Protocol

from engine.types import Rendered


class Renderer(Protocol):
    origin: str  # e.g. "template qwen3.6"
    source_path: str  # the template or encoder file name, as locations name it

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        *,
        add_generation_prompt: bool,
        kwargs: dict | None = None,
    ) -> Rendered:
        """Render, or raise engine.errors.RenderError naming the model, the file and the cause."""

    def source_lines(self) -> list[str]:
        """The source text the `Rendered.source_line` numbers index into (1-based)."""
