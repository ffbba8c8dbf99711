"""What cause attribution computes more than once for one cell, kept by content while the cell is explained.

Blame re-runs a cell with one change; the steps before the change are the cell's own (the same parses of the same
completions). A `BlameMemo` is made by the cell whose cause is asked (engine.simulate.run_cell_with) and handed to its
re-runs; it lives as long as that cell's computation. Each entry is keyed by everything its answer is computed from,
so a hit is the answer the computation would give. (Counterfactual renders are shared between cells already, per
template and request: JinjaRenderer.render_counterfactual.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.render.cache import request_key
from engine.types import ParseResult


class BlameMemo:
    def __init__(self) -> None:
        self._parses: dict[tuple, tuple[Any, ParseResult]] = {}
        # Objects whose identity is part of a key, kept alive so that no other object takes their id meanwhile.
        self._held: dict[int, object] = {}

    def _identity(self, thing: object) -> int:
        self._held.setdefault(id(thing), thing)
        return id(thing)

    def parse(self, parse_served: Callable[..., tuple[Any, ParseResult]], engine: object, text: str,
              request: dict[str, Any], options: dict[str, Any]) -> tuple[Any, ParseResult]:
        """`parse_served(engine, text, request, options)` (engine.serving.registry: the engine that parsed and its
        result), once per engine, text, request and options: the tokenizer by identity, the rest by content (the
        engine by its class and its attributes; request_key tells apart what parses differently)."""
        fields = {name: value for name, value in request.items() if name != "tokenizer"}
        # The engine by its class and its own state (a column's engine object is made anew for each run).
        content = request_key([type(engine), vars(engine), fields, options], None, False, None)
        if not isinstance(content, bytes):  # something pickle refuses: its repr may hold an address, never shared
            return parse_served(engine, text, request, options)
        key = (self._identity(request.get("tokenizer")), text, content)
        found = self._parses.get(key)
        if found is None:
            found = self._parses[key] = parse_served(engine, text, request, options)
        return found
