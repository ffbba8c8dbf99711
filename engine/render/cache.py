"""A renderer that renders each distinct request once.

The matrix renders the same request for several engines, cause attribution re-runs whole cells with one kwarg
flipped, and the web app re-renders a column when one cell changes: most renders repeat one already done. Renders
are functions of (messages, tools, add_generation_prompt, kwargs), and `Rendered` is immutable, so a repeat
returns the first result. (A template that reads the clock, like GPT-OSS's `strftime_now` date, keeps the date of
its first render for as long as the entry lives; one that calls Jinja's `random` gets a fixed draw.)
"""

from __future__ import annotations

import io
import pickle
import threading
from collections import OrderedDict
from typing import Any

from engine.render import Renderer
from engine.types import Rendered


def request_key(messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                kwargs: dict | None) -> bytes | str:
    """Equal for two requests only when they render alike.

    A pickle, not JSON: it keeps key order (templates iterate mappings in order) and tells 1, 1.0 and True, and
    tuples and lists, apart; and it copies strings where repr escapes them character by character (7x faster on a
    prompt with a long system message). The pickler's memo is off, so two equal requests give the same bytes
    whether or not they share objects. What pickle refuses falls back to repr, and an object whose repr holds its
    address just never hits.
    """
    request = (messages, tools, add_generation_prompt, kwargs)
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True
    try:
        pickler.dump(request)
    except (pickle.PicklingError, TypeError, AttributeError, ValueError, RecursionError):
        return repr(request)
    return buffer.getvalue()


class CachedRenderer:
    """Wraps any Renderer; everything but `render` is the wrapped renderer's own."""

    def __init__(self, inner: Renderer, max_entries: int = 2048) -> None:
        self.inner = inner
        self._max_entries = max_entries
        self._memo: OrderedDict[bytes | str, Rendered] = OrderedDict()
        self._lock = threading.Lock()  # the web app renders from several threads
        self.hits = 0
        self.misses = 0

    @property
    def origin(self) -> str:
        return self.inner.origin

    @property
    def source_path(self) -> str:
        return self.inner.source_path

    def source_lines(self) -> list[str]:
        return self.inner.source_lines()

    def __getattr__(self, name: str) -> Any:
        # render_reference, template_context, prepare, ...: the wrapped renderer's, unchanged. Never for dunder
        # names or before `inner` exists (copy and pickle probe those on a bare instance).
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def cache_clear(self) -> None:
        with self._lock:
            self._memo.clear()
            self.hits = self.misses = 0
        inner_clear = getattr(self.inner, "cache_clear", None)
        if inner_clear is not None:
            inner_clear()  # e.g. a Jinja renderer's converted messages

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
               kwargs: dict | None = None) -> Rendered:
        key = request_key(messages, tools, add_generation_prompt, kwargs)
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                self.hits += 1
                return hit
            self.misses += 1
        rendered = self.inner.render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        with self._lock:
            self._memo[key] = rendered
            if len(self._memo) > self._max_entries:
                self._memo.popitem(last=False)
        return rendered
