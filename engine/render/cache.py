"""A renderer that renders each distinct request once.

The matrix renders the same request for several engines, cause attribution re-runs whole cells with one kwarg
flipped, and the web app re-renders a column when one cell changes: most renders repeat one already done. Renders
are functions of (messages, tools, add_generation_prompt, kwargs), and `Rendered` is immutable, so a repeat
returns the first result. (A template that reads the clock, like GPT-OSS's `strftime_now` date, keeps the date of
its first render for as long as the entry lives; one that calls Jinja's `random` gets a fixed draw.)

Given a `RenderStore`, a renderer that names what its text depends on besides the request (`persisted_identity`, a
Jinja template's source and special tokens) also keeps the texts of the requests asked through `render_kept` across
runs (engine.render_store), and such a request rendered in an earlier run is read back instead of rendered again. The
matrix asks so for its scenarios' requests: scripted, few, and asked again run after run. A trace's or a session's
requests are the user's own, rendered once per analysis and as large as the trace (a session's prompts add up to the
square of its length): `render`, kept in memory only.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from engine.render import Renderer
from engine.types import Provenance, Rendered


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


# A CachedRenderer's ways to render: what watches every render wraps each (`watching_renders`).
RENDER_METHODS = ("render", "render_kept")


@contextlib.contextmanager
def watching_renders(renderer: Any, seen: Callable[[list[dict], list[dict] | None, bool, dict | None], None]
                     ) -> Iterator[None]:
    """Every request `renderer` is asked to render, by any of RENDER_METHODS, handed to `seen` first as deep copies
    (callers go on appending to the history they rendered); the renderer as it was after the block (the bench's
    recorder, a test's)."""
    for method in RENDER_METHODS:
        original = getattr(renderer, method, None)
        if original is None:
            continue

        def render(messages, tools, *, add_generation_prompt, kwargs=None, _render=original):
            seen(copy.deepcopy(messages), copy.deepcopy(tools), add_generation_prompt, copy.deepcopy(kwargs))
            return _render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)

        setattr(renderer, method, render)  # an instance attribute, removed after the block
    try:
        yield
    finally:
        for method in RENDER_METHODS:
            renderer.__dict__.pop(method, None)


@dataclass(frozen=True)
class KeptRender:
    """What a store keeps of one render: its text, and which message and template line produced each character once
    something has read them (the bridge does, to find where the new messages start)."""

    text: str
    provenance: Provenance | None = None


class RenderStore(Protocol):
    """Renders kept across runs, by a key that covers everything they were rendered from (engine.render_store)."""

    def get(self, key: str) -> KeptRender | None: ...

    def keep(self, key: str, kept: KeptRender) -> None: ...


class CachedRenderer:
    """Wraps any Renderer; everything but `render` and `render_kept` is the wrapped renderer's own."""

    def __init__(self, inner: Renderer, max_entries: int = 2048, store: RenderStore | None = None) -> None:
        self.inner = inner
        self._max_entries = max_entries
        self._memo: OrderedDict[bytes | str, Rendered] = OrderedDict()
        self._lock = threading.Lock()  # the web app renders from several threads
        self.hits = 0
        self.misses = 0
        self.stored_hits = 0  # of the misses, those read back from the store
        # What the text depends on besides the request; None: not kept across runs (the clock, random, no store).
        identity = getattr(inner, "persisted_identity", None) if store is not None else None
        self.store = store if identity is not None else None
        self._identity: bytes = identity or b""

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
            self.hits = self.misses = self.stored_hits = 0
        inner_clear = getattr(self.inner, "cache_clear", None)
        if inner_clear is not None:
            inner_clear()  # e.g. a Jinja renderer's converted messages

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
               kwargs: dict | None = None) -> Rendered:
        return self._render(messages, tools, add_generation_prompt, kwargs, kept=False)

    def render_kept(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
                    kwargs: dict | None = None) -> Rendered:
        """`render`, the text read from the store where an earlier run kept it, else kept there."""
        return self._render(messages, tools, add_generation_prompt, kwargs, kept=True)

    def _render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                kwargs: dict | None, kept: bool) -> Rendered:
        key = request_key(messages, tools, add_generation_prompt, kwargs)
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                self.hits += 1
                return hit
            self.misses += 1
        stored_key = hashlib.sha256(self._identity + key).hexdigest() \
            if kept and self.store is not None and isinstance(key, bytes) else None  # a repr key may hold an address
        found = self.store.get(stored_key) if stored_key is not None else None
        if found is not None:
            rendered = self._from_store(stored_key, found, messages, tools, add_generation_prompt, kwargs)
            with self._lock:
                self.stored_hits += 1
        else:
            rendered = self.inner.render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
            if stored_key is not None:
                self.store.keep(stored_key, KeptRender(str(rendered.text)))
                rendered = self._keeping_provenance(stored_key, rendered)
        with self._lock:
            self._memo[key] = rendered
            if len(self._memo) > self._max_entries:
                self._memo.popitem(last=False)
        return rendered

    def _from_store(self, key: str, kept: KeptRender, messages: list[dict], tools: list[dict] | None,
                    add_generation_prompt: bool, kwargs: dict | None) -> Rendered:
        if kept.provenance is not None:
            return Rendered(text=kept.text, message_index=kept.provenance[0], source_line=kept.provenance[1],
                            source_path=self.inner.source_path, origin=self.inner.origin)
        return self._keeping_provenance(key, self.inner.stored(kept.text, messages, tools,
                                                               add_generation_prompt=add_generation_prompt,
                                                               kwargs=kwargs))

    def _keeping_provenance(self, key: str, rendered: Rendered) -> Rendered:
        """`rendered`, its provenance kept beside its text once something reads it."""
        compute = rendered.provenance
        store = self.store
        if compute is None or store is None:
            return rendered

        def provenance() -> Provenance:
            message_index, source_line = compute()
            store.keep(key, KeptRender(str(rendered.text), (tuple(message_index), tuple(source_line))))
            return message_index, source_line

        return Rendered(text=rendered.text_source, source_path=rendered.source_path, origin=rendered.origin,
                        provenance=provenance, known_prefix=rendered.known_prefix)


def render_kept(renderer: Renderer, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
                kwargs: dict | None = None) -> Rendered:
    """`renderer.render_kept` where the renderer keeps texts across runs (a CachedRenderer), else its `render`."""
    render = getattr(renderer, "render_kept", None) or renderer.render
    return render(messages, tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
