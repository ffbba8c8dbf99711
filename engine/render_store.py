"""Prompts kept across runs: the text a chat template rendered for one of the matrix's scenario requests
(`CachedRenderer.render_kept`), stored in the engine cache's result store (engine.serving.real.results, under
`renders/<fingerprint>/`, the fingerprint of `code_fingerprint()`) and read back instead of rendering that request
again (engine.render.cache.CachedRenderer).

A key covers everything the text is computed from: the template's source and the special tokens it is given
(`JinjaRenderer.persisted_identity`) and the request (messages, tools, add_generation_prompt, kwargs, told apart as
`request_key` tells them); the folder, the code that renders (every module of `engine`, and transformers' and
jinja2's versions among the pinned packages). A template that reads the clock or draws random numbers has no identity
and is never kept. A render that fails is rendered again (and fails again). A prompt's text is kept when rendered;
which message and template line produced each character, once something reads it (recorded from the template, as for
any prompt), beside it.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

from engine.fingerprint import code_fingerprint
from engine.render.cache import KeptRender
from engine.serving.real.results import FingerprintFolder, persisted_results_enabled, result_cache

STORE = "renders"  # the result store's folder for them


@functools.cache
def render_folder() -> FingerprintFolder:
    """Where this code's prompts are kept (results/renders/<fingerprint>/): another code's are pruned as a release's
    answers of another glue are (ResultCache.prune)."""
    return FingerprintFolder.of(STORE, {"code": code_fingerprint()})


def persisted_renders_enabled() -> bool:
    """`DRIFT_RENDER_STORE=0` renders every prompt anew (the tests do, but for the store's own); `DRIFT_RESULT_CACHE=0`
    keeps nothing at all."""
    return persisted_results_enabled() and os.environ.get("DRIFT_RENDER_STORE", "1") != "0"


def _runs(values: tuple[int, ...]) -> list[int]:
    """[value, count, value, count, ...]: a prompt's provenance is long runs of one message and one line."""
    runs: list[int] = []
    for value, group in itertools.groupby(values):
        runs += (value, len(list(group)))  # counted in C: a prompt is thousands of characters
    return runs


def _values(runs: Any, length: int) -> tuple[int, ...] | None:
    """The `length` values `_runs` gave, or None for anything else (an entry some other code wrote)."""
    if not isinstance(runs, list) or len(runs) % 2 or not all(type(x) is int for x in runs) or \
            any(count < 1 for count in runs[1::2]) or sum(runs[1::2]) != length:
        return None
    values: list[int] = []
    for value, count in zip(runs[::2], runs[1::2]):
        values += [value] * count
    return tuple(values)


class PersistedRenders:
    """The result store's renders, as an `engine.render.cache.RenderStore`. The store is looked up at every use, not
    when a model is loaded: the bench's cold run points the result cache at an empty folder, or turns it off, with
    the models already loaded."""

    def get(self, key: str) -> KeptRender | None:
        if not persisted_renders_enabled():
            return None
        entry = result_cache().get(render_folder(), key)
        text = entry.get("text") if entry is not None else None
        if not isinstance(text, str):
            return None
        if "message_index" not in entry:
            return KeptRender(text)
        message_index = _values(entry["message_index"], len(text))
        source_line = _values(entry.get("source_line"), len(text))
        if message_index is None or source_line is None:
            return KeptRender(text)
        return KeptRender(text, (message_index, source_line))

    def keep(self, key: str, kept: KeptRender) -> None:
        if not persisted_renders_enabled():
            return
        entry: dict[str, Any] = {"text": kept.text}
        if kept.provenance is not None:
            entry.update(message_index=_runs(kept.provenance[0]), source_line=_runs(kept.provenance[1]))
        result_cache().put(render_folder(), key, entry)
