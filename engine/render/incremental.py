"""The text of a Jinja chat template rendered at the cost of what changed since an earlier render of it.

A long agent session renders its whole history at every request, and the history only grows: the template's
top-level loops over the messages redo, request after request, iterations whose every input is the same. This
module runs the real template (the same nodes, compiled by the same sandboxed environment) and skips such
iterations, replaying what they produced. It is sound by construction, with a fallback:

* Which loops. A top-level `{% for x in seq %}` (a direct child of the template, so its output goes straight to
  the render's stream) with a plain target, no `else`, no `if` filter, not recursive, whose body (with the macros
  it names, transitively: those it can call) passes a static check: `loop` is read only as `loop.<attr>` for
  the attributes below, `messages` only as `messages[i]` or `messages|length` and is never assigned, no
  break/continue at the loop's own level, no call block, `do`, include, import or block, and none of the names
  whose value is stateful or impure (`cycler`, `joiner`, `lipsum`, `strftime_now`, `self`, `super`, `caller`, the
  `random` filter). The loop's iterable is wrapped in a marker call; the generated Python is checked to differ from
  the original template's only by that call on the loop's own line.
* What an iteration can read. Jinja resets a loop body's variables to their outer values at every iteration
  (`l_1_x = l_0_x`), so an iteration's output and effects are a function of: its item; the loop attributes it
  reads; the values of the outer names its body and the macros can reference (compared once per render, strictly:
  type and value); `messages[i]` and `messages|length` (a recording list); and the attributes of the namespaces
  that exist before the loop, the only mutable state an ImmutableSandboxedEnvironment allows (a recording
  subclass of Jinja's Namespace; a read of any other pre-existing namespace, printing one, or a macro reached
  through a variable refuses the render). Each iteration is recorded with what it read and wrote. Qwen's reverse
  scan reads `loop.index0` and `messages|length` only as `(messages|length - 1) - loop.index0`, the item's own
  index in `messages`: recognised in the AST, such reads count as the position they are.
* What is reused. Records are kept by the item's position in the iterable (from the end for `seq[::-1]`, so that
  appending messages keeps positions). A run of iterations is replayed in one step when its items are the same
  objects, no record in it read a loop attribute or `messages` that the new length or the first changed item
  affects, and every namespace attribute a record in it read before writing has the value it had then; then the
  namespaces take the run's writes and the stream gets its text. Anything else is executed by the real body.
* The fallback. A render that raises, or that read something it could not record, is rendered again in full by
  the caller; a template outside the class says why (`IncrementalText.refusal`).
"""

from __future__ import annotations

import bisect
import operator
import sys
import threading
import types
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jinja2
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.runtime import LoopContext, Macro, Namespace, missing

from engine.prefix import JoinedText, common_prefix_from_end
from engine.render.cache import request_key

# Loop attributes a memoised body may read; how each depends on the position (below).
_LOOP_ATTRIBUTES = frozenset({"index0", "index", "revindex0", "revindex", "first", "last", "length", "previtem",
                              "nextitem", "depth", "depth0"})
_IMPURE_NAMES = frozenset({"cycler", "joiner", "lipsum", "strftime_now", "self", "super", "caller", "varargs",
                           "kwargs"})
_IMPURE_FILTERS = frozenset({"random"})
_REFUSED_NODES = (nodes.CallBlock, nodes.ExprStmt, nodes.Scope, nodes.ScopedEvalContextModifier,
                  nodes.EvalContextModifier, nodes.Extends, nodes.Block, nodes.Include, nodes.Import,
                  nodes.FromImport, nodes.OverlayScope, nodes.With)
_ABSENT = object()  # a namespace attribute that does not exist (yet)

# How a loop attribute read depends on the record's position c, in a loop over n items. "stable": the same for
# the same c whatever n; "anti": changes with n; "end": depends on whether c is the last position; "next": the
# item at position c + 1.
_FORWARD = {"index0": "stable", "index": "stable", "first": "stable", "previtem": "stable", "depth": "stable",
            "depth0": "stable", "revindex0": "anti", "revindex": "anti", "length": "anti", "last": "end",
            "nextitem": "next"}
_BACKWARD = {"revindex0": "stable", "revindex": "stable", "last": "stable", "nextitem": "stable", "depth": "stable",
             "depth0": "stable", "index0": "anti", "index": "anti", "length": "anti", "first": "end",
             "previtem": "next"}


def same_value(a: Any, b: Any) -> bool:
    """True only when a template cannot tell `a` from `b`: the same object, or plain data of the same types with
    equal values (1, 1.0 and True differ; so do 0.0 and -0.0). A macro of this template counts as the same when its
    code is: what it reads is compared as outer names."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str or kind is int or kind is bool or kind is bytes:
        return a == b
    if kind is float:
        return a.hex() == b.hex()
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(map(same_value, a, b))
    if kind is dict:
        return len(a) == len(b) and all(same_value(ka, kb) and same_value(a[ka], b[kb]) for ka, kb in zip(a, b))
    if kind is Macro:
        return a._func.__code__ is b._func.__code__
    return False


def _strict_key(value: list | tuple | dict) -> bytes | list | tuple | dict:
    """Plain data as its pickle (equal only for data a template cannot tell apart: types, key order, -0.0 kept;
    `engine.render.cache.request_key`), compared at C speed; what pickle refuses stays itself (`same_value`)."""
    key = request_key(value, None, False, None)
    return key if isinstance(key, bytes) else value


def identity_prefix(a: list, b: list) -> int:
    """How many leading items of `a` and `b` are the same objects (at C speed: a session compares thousands)."""
    if all(map(operator.is_, a, b)):
        return min(len(a), len(b))
    flags = list(map(operator.is_, a, b))
    try:
        return flags.index(False)
    except ValueError:
        return len(flags)


# ---------------------------------------------------------------------------------------------------------------
# What one render reads, recorded


class _Active(threading.local):
    render: _RenderState | None = None


_ACTIVE = _Active()


class RecordingNamespace(Namespace):
    """Jinja's Namespace, telling the render being recorded which attributes an iteration reads and writes."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: B902 (Namespace's own signature)
        Namespace.__init__(*args, **kwargs)
        state = _ACTIVE.render
        if state is not None:
            state.created.append(args[0])
            state.serials[id(args[0])] = len(state.created)

    def __getattribute__(self, name: str) -> Any:
        if name != "_Namespace__attrs" and name != "__class__":
            state = _ACTIVE.render
            if state is not None and state.record is not None:
                state.namespace_read(self, name)
        return Namespace.__getattribute__(self, name)

    def __setitem__(self, name: str, value: Any) -> None:
        state = _ACTIVE.render
        if state is not None and state.record is not None:
            state.namespace_written(self, name)
        Namespace.__setitem__(self, name, value)

    def __repr__(self) -> str:
        state = _ACTIVE.render
        if state is not None and state.record is not None:
            state.refuse("an iteration printed a namespace")
        return Namespace.__repr__(self)


def _attrs(namespace: Namespace) -> dict:
    return object.__getattribute__(namespace, "_Namespace__attrs")


class RecordedMessages(list):
    """The template's `messages`: a real list of the same messages, telling the iteration being recorded which
    items it read (the static check lets a memoised body read it only by index and length)."""

    __slots__ = ()

    def __getitem__(self, index):
        state = _ACTIVE.render
        if state is not None and state.record is not None:
            record = state.record
            if type(index) is int and 0 <= index < list.__len__(self):
                if index > record.message_max:
                    record.message_max = index
            else:
                record.whole_messages = True
        return list.__getitem__(self, index)

    def __len__(self) -> int:
        state = _ACTIVE.render
        if state is not None and state.record is not None and not state.loop.length_is_position:
            state.record.whole_messages = True
        return list.__len__(self)

    def __iter__(self):
        state = _ACTIVE.render
        if state is not None and state.record is not None:
            state.record.whole_messages = True
        return list.__iter__(self)


@dataclass(slots=True)
class _Record:
    """One executed iteration: what it read and wrote."""

    position: int
    start: int  # where its output begins in the render's stream
    kinds: set = field(default_factory=set)  # loop reads: "anti", "end", "next"
    message_max: int = -1
    whole_messages: bool = False
    reads: set = field(default_factory=set)  # (slot, attribute) read before this iteration wrote it
    writes: set = field(default_factory=set)
    values: dict = field(default_factory=dict)  # each written attribute's value at the iteration's end


@dataclass
class _Run:
    """One loop of one render, every position recorded (positions count from the end for a backward loop). Each
    sorted position list says which records read what; `writes` holds each write's value."""

    items: list  # by position
    chat: list
    outer: list  # the outer names' values at the loop's entry
    slots: frozenset  # the namespaces that existed at the loop's entry, by top-level name
    entry: dict  # (slot, attribute) -> value at the loop's entry
    out: list  # each position's text
    kinds: dict = field(default_factory=dict)  # "anti" / "end" / "next" / "whole_messages" -> positions
    message_positions: list = field(default_factory=list)  # records that read messages[i] ...
    message_highest: list = field(default_factory=list)  # ... and the highest i each read
    reads: dict = field(default_factory=dict)  # (slot, attribute) -> positions that read it before writing it
    writes: dict = field(default_factory=dict)  # (slot, attribute) -> (positions, values)
    printed: bool = False  # whether any position's text is not empty (a scan that prints nothing replays nothing)


_KINDS = ("anti", "end", "next", "whole_messages")
_NO_RUN = _Run([], [], [], frozenset(), {}, [])


def _in_direction(positions: list, c: int, forward: bool) -> int | None:
    """The first of sorted `positions` at or after c in the loop's direction (c, c+1, ... or c, c-1, ...)."""
    if forward:
        k = bisect.bisect_left(positions, c)
        return positions[k] if k < len(positions) else None
    k = bisect.bisect_right(positions, c)
    return positions[k - 1] if k else None


def _has(positions: list, p: int) -> bool:
    k = bisect.bisect_left(positions, p)
    return k < len(positions) and positions[k] == p


def _between(positions: list, lo: int, hi: int) -> tuple[int, int]:
    return bisect.bisect_left(positions, lo), bisect.bisect_left(positions, hi)


class _RenderState:
    def __init__(self, chat: RecordedMessages) -> None:
        self.chat = chat
        self.out: list[str] = []
        self.created: list[Namespace] = []  # every namespace of this render (held, so that ids stay unique)
        self.serials: dict[int, int] = {}
        self.record: _Record | None = None
        self.loop: _LoopRun | None = None
        self.refused: str | None = None
        self.finished: list[_LoopRun] = []  # the memoised loops that ran to their end
        self.executed = self.replayed = 0
        self.prefixes: dict[int, tuple[list, int]] = {}

    def chat_prefix(self, old_chat: list) -> int:
        """How many leading messages `old_chat` shares with this render's (the same objects)."""
        found = self.prefixes.get(id(old_chat))
        if found is None or found[0] is not old_chat:
            found = self.prefixes[id(old_chat)] = (old_chat, identity_prefix(old_chat, self.chat))
        return found[1]

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def namespace_read(self, namespace: Namespace, name: str) -> None:
        slot = self.loop.slots.get(id(namespace))
        if slot is not None:
            key = (slot, name)
            if key not in self.record.writes:
                self.record.reads.add(key)
        elif self.serials.get(id(namespace), 0) <= self.loop.serial:
            self.refuse(f"an iteration read attribute {name!r} of a namespace it cannot track")

    def namespace_written(self, namespace: Namespace, name: str) -> None:
        slot = self.loop.slots.get(id(namespace))
        if slot is not None:
            self.record.writes.add((slot, name))
        elif self.serials.get(id(namespace), 0) <= self.loop.serial:
            self.refuse(f"an iteration wrote attribute {name!r} of a namespace it cannot track")


class _LoopRun:
    """One memoised loop of one render: hands the real loop the items to execute, replays the rest."""

    def __init__(self, spec: _LoopSpec, state: _RenderState, iterable: list, frame) -> None:
        self.spec = spec
        self.state = state
        self.forward = forward = not spec.backward
        self.kind_of = _FORWARD if forward else _BACKWARD
        self.length_is_position = spec.length_is_position
        self.iterable = iterable
        self.n = n = list.__len__(iterable)
        # By position: a loop over `messages[::-1]` (never reassigned: checked) reads the chat's own items.
        self.items = iterable if forward else state.chat if spec.over_messages else \
            list.__getitem__(iterable, slice(None, None, -1))
        local = frame.f_locals
        context = local["context"]
        # The outer names' values. A namespace stands as its name, its slot: its attributes are compared as they
        # are read. (An iteration reaches another namespace made before the loop only through a slot's attribute,
        # and such a read refuses the render: `_RenderState.namespace_read`.)
        self.slots: dict[int, str] = {}
        self.namespaces: dict[str, Namespace] = {}
        entry: dict[tuple[str, str], Any] = {}
        self.outer = outer = []
        for name in spec.outer_names:
            value = local["l_0_" + name] if ("l_0_" + name) in local else context.resolve_or_missing(name)
            if type(value) is RecordingNamespace:
                slot = self.slots.setdefault(id(value), name)
                if slot == name:
                    self.namespaces[name] = value
                    for attribute, attribute_value in _attrs(value).items():
                        entry[(name, attribute)] = attribute_value
                        self._check_reachable(attribute_value, f"{name}.{attribute}")
                value = ("namespace", slot)
            else:
                value = self._check_reachable(value, name)
            outer.append(value)
        self.serial = len(state.created)
        slots = frozenset(self.namespaces)
        self.old = spec.previous(self.outer, slots)
        # After a run that printed nothing, every replayed text is empty: the new run's start so (`_replay`).
        silent = self.old is not None and not self.old.printed
        self.new = _Run(self.items, state.chat, self.outer, slots, entry, [""] * n if silent else [None] * n)
        self.segments: list[tuple[int, int] | _Record] = []  # in iteration order: replayed ranges, executed records
        old = self.old
        if old is not None:
            self.chat_prefix = state.chat_prefix(old.chat)
            self.chat_same = self.chat_prefix == len(old.chat) == len(state.chat)
            same = self.chat_prefix if spec.over_messages else identity_prefix(old.items, self.items)
            self.limit = min(same, len(old.items), n)
        self.k = 0  # the next iteration
        self.current: _Record | None = None

    def _check_reachable(self, value: Any, name: str) -> Any:
        """`value` as compared between renders (plain data by its pickle). A macro the static check did not see
        (reached through a variable, or held in data) refuses the render: its body was not checked."""
        if type(value) is Macro and value.name not in self.spec.macros:
            self.state.refuse(f"the loop can call macro {value.name!r} through {name!r}")
        elif type(value) in (list, tuple, dict):
            key = _strict_key(value)
            if not isinstance(key, bytes):
                self.state.refuse(f"{name!r} holds more than plain data")
            return ("data", key)
        return value

    # -- the iteration protocol the generated loop drives -----------------------------------------------------

    def next_item(self) -> tuple[int, Any]:
        state = self.state
        if self.current is not None:
            self._finish(self.current)
        while True:
            k = self.k
            if k >= self.n:
                state.finished.append(self)  # its records are assembled if the render succeeds
                raise StopIteration
            c = k if self.forward else self.n - 1 - k
            if self.old is not None and c < self.limit:
                m = self._valid_run(c)
                if m:
                    self._replay(c, m)
                    self.k += m
                    continue
            item = list.__getitem__(self.iterable, k)
            self.current = state.record = _Record(c, len(state.out))
            state.loop = self
            state.executed += 1
            self.k = k + 1
            return k, item

    def loop_read(self, attribute: str) -> None:
        record = self.state.record
        if record is None or self.state.loop is not self:
            return
        kind = self.kind_of.get(attribute)
        if kind is None:
            self.state.refuse(f"an iteration read loop.{attribute}")
        elif kind != "stable" and not (self.length_is_position and attribute == "index0"):
            record.kinds.add(kind)

    def _finish(self, record: _Record) -> None:
        state = self.state
        # The iteration's text as one piece, the piece a later render's replay of it hands over (the same object).
        text = "".join(state.out[record.start:])
        state.out[record.start:] = [text] if text else []
        self.new.out[record.position] = text
        self.new.printed = self.new.printed or bool(text)
        record.values = {key: _attrs(self.namespaces[key[0]]).get(key[1], _ABSENT) for key in record.writes}
        self.segments.append(record)
        self.current = state.record = None

    # -- reuse -----------------------------------------------------------------------------------------------

    def _old_entry(self, key: tuple, c: int) -> Any:
        """The value `key` had when the old run entered position c."""
        old = self.old
        written = old.writes.get(key)
        if written is not None:
            positions, values = written
            if self.forward:
                k = bisect.bisect_left(positions, c) - 1
                if k >= 0:
                    return values[k]
            else:
                k = bisect.bisect_right(positions, c)
                if k < len(positions):
                    return values[k]
        return old.entry.get(key, _ABSENT)

    def _valid_run(self, c: int) -> int:
        """How many records of the old run, from position c on in the loop's direction, hold for this render."""
        old, forward, n = self.old, self.forward, self.n
        n_old = len(old.items)
        ends: list[int] = [self.limit if forward else -1]  # the first position past the run

        def ahead(p: int) -> bool:
            return p >= c if forward else 0 <= p <= c

        def first(positions: list) -> None:
            found = _in_direction(positions, c, forward)
            if found is not None:
                ends.append(found)

        if n != n_old:  # reads that depend on the length, and whether a position is the last
            first(old.kinds.get("anti", []))
            ends.extend(p for p in {n_old - 1, n - 1} if ahead(p) and _has(old.kinds.get("end", []), p))
        p = self.limit - 1  # the record before the first changed item, if it read that item
        if ahead(p) and not self.limit == n_old == n and _has(old.kinds.get("next", []), p):
            ends.append(p)
        if not self.chat_same:
            first(old.kinds.get("whole_messages", []))
            if self.chat_prefix < len(old.chat):
                order = range(len(old.message_positions)) if forward else \
                    range(len(old.message_positions) - 1, -1, -1)
                for i in order:
                    position = old.message_positions[i]
                    if ahead(position) and old.message_highest[i] >= self.chat_prefix:
                        ends.append(position)
                        break
        keys = set(old.entry) | set(old.writes)
        for slot, namespace in self.namespaces.items():
            keys.update((slot, attribute) for attribute in _attrs(namespace))
        for key in keys:
            now = _attrs(self.namespaces[key[0]]).get(key[1], _ABSENT)
            if same_value(now, self._old_entry(key, c)):
                continue
            read = _in_direction(old.reads.get(key, []), c, forward)
            if read is None:
                continue
            written = old.writes.get(key)
            write = _in_direction(written[0], c, forward) if written else None
            if write is None or (write >= read if forward else write <= read):
                ends.append(read)  # read before any record overwrites the difference
        return min(ends) - c if forward else c - max(ends)

    def _replay(self, c: int, m: int) -> None:
        old, state = self.old, self.state
        lo, hi = (c, c + m) if self.forward else (c - m + 1, c + 1)
        if old.printed:  # otherwise every text is empty, as the new run's already are; an empty one is no piece
            texts = old.out[lo:hi]
            self.new.out[lo:hi] = texts
            state.out.extend(filter(None, texts if self.forward else reversed(texts)))
            self.new.printed = True
        for (slot, attribute), (positions, values) in old.writes.items():
            a, b = _between(positions, lo, hi)
            if a < b:
                value = values[b - 1] if self.forward else values[a]  # the last write in the loop's order
                if value is _ABSENT:
                    _attrs(self.namespaces[slot]).pop(attribute, None)
                else:
                    _attrs(self.namespaces[slot])[attribute] = value
        self.segments.append((lo, hi))
        state.replayed += m

    def finished_run(self) -> _Run:
        """This render's records in position order, the replayed ones taken from the old run. The old run is being
        replaced (the same outer values): when this render starts with a replay of its first positions, its lists
        are cut after them and extended, in place, so that a request costs what it added."""
        run, old = self.new, self.old or _NO_RUN
        segments = self.segments if self.forward else self.segments[::-1]
        prefix = segments[0][1] if segments and type(segments[0]) is tuple and segments[0][0] == 0 else None

        def merge(positions: list, parallel: list | None, entries) -> tuple[list, list | None]:
            """The old run's sorted `positions` (and the `parallel` values beside them) within the replayed ranges,
            with `entries(record)`, (position, value) pairs, of each executed record, in position order."""
            out_p: list = []
            out_v: list | None = [] if parallel is not None else None
            start = 0
            if prefix is not None:
                b = bisect.bisect_left(positions, prefix)
                start = 1
            for segment in segments[start:]:
                if type(segment) is tuple:
                    a, b2 = _between(positions, *segment)
                    out_p.extend(positions[a:b2])
                    if out_v is not None:
                        out_v.extend(parallel[a:b2])
                else:
                    for position, value in entries(segment):
                        out_p.append(position)
                        if out_v is not None:
                            out_v.append(value)
            if prefix is not None:  # the old lists, cut after the replayed prefix and extended
                del positions[b:]
                positions.extend(out_p)
                if parallel is not None:
                    del parallel[b:]
                    parallel.extend(out_v)
                return positions, parallel
            return out_p, out_v

        for kind in _KINDS:
            def kind_entries(record, kind=kind):
                hit = kind in record.kinds or (kind == "whole_messages" and record.whole_messages)
                return [(record.position, None)] if hit else []
            run.kinds[kind] = merge(old.kinds.get(kind, []), None, kind_entries)[0]
        keys = set(old.reads) | set(old.writes)
        for segment in segments:
            if type(segment) is _Record:
                keys.update(segment.reads)
                keys.update(segment.writes)
        for key in keys:
            reads = merge(old.reads.get(key, []), None,
                          lambda record, key=key: [(record.position, None)] if key in record.reads else [])[0]
            written = old.writes.get(key, ([], []))
            positions, values = merge(written[0], written[1],
                                      lambda record, key=key: [(record.position, record.values[key])]
                                      if key in record.writes else [])
            if reads:
                run.reads[key] = reads
            if positions:
                run.writes[key] = (positions, values)
        run.message_positions, run.message_highest = merge(
            old.message_positions, old.message_highest,
            lambda record: [(record.position, record.message_max)] if record.message_max >= 0 else [])
        return run


class _MemoLoopContext(LoopContext):
    """The real LoopContext, positioned by the run at each item it executes (its attributes are Jinja's own,
    computed from index0, the neighbours and the length)."""

    def __init__(self, run: _LoopRun, undefined, recurse=None, depth0: int = 0) -> None:
        super().__init__(run.iterable, undefined, recurse, depth0)
        self._length = run.n
        self.run = run

    def __next__(self):
        k, item = self.run.next_item()
        iterable, n = self.run.iterable, self.run.n
        self.index0 = k
        self._before = list.__getitem__(iterable, k - 1) if k else missing
        self._current = item
        self._after = list.__getitem__(iterable, k + 1) if k + 1 < n else missing
        self._iterator = iter(())
        return item, self


class _PlainLoop:
    """The iterator of a memoised loop whose body never reads `loop`."""

    def __init__(self, run: _LoopRun) -> None:
        self.run = run

    def __iter__(self):
        return self

    def __next__(self):
        return self.run.next_item()[1]


class _Marked:
    """What the marker call returns: the loop's real iterable, tagged with its loop."""

    __slots__ = ("spec", "iterable")

    def __init__(self, spec: _LoopSpec, iterable: Any) -> None:
        self.spec = spec
        self.iterable = iterable

    def __iter__(self):  # a loop whose body never reads `loop`: the generated code iterates this directly
        return self.spec.start(self, None, sys._getframe(1))


# ---------------------------------------------------------------------------------------------------------------
# The template, checked and compiled


class _LoopSpec:
    def __init__(self, owner: IncrementalText, index: int, node: nodes.For, outer_names: list[str],
                 backward: bool, length_is_position: bool, macros: frozenset[str]) -> None:
        self.owner = owner
        self.macros = macros  # the names of the macros its body can call
        # Over `messages` or `messages[::-1]` (never reassigned: checked), so its items by position are the chat's.
        self.over_messages = (isinstance(node.iter, nodes.Name) and node.iter.name == "messages") or \
            _is_reversal(node.iter) == "messages"
        self.index = index
        self.node = node
        self.outer_names = outer_names
        self.backward = backward
        self.length_is_position = length_is_position

    def previous(self, outer: list, slots: frozenset) -> _Run | None:
        """The latest run of this loop, in this thread, whose outer names had the same values."""
        for run in self.owner._memo().get(self.index, ()):
            if run.slots == slots and all(map(same_value, run.outer, outer)):
                return run
        return None

    def start(self, marked: _Marked, undefined, frame):
        state = _ACTIVE.render
        iterable = marked.iterable
        if state is None or state.record is not None or type(iterable) not in (list, tuple, RecordedMessages) or \
                frame.f_code.co_name != "root":
            return LoopContext(iterable, undefined) if undefined is not None else iter(iterable)
        run = _LoopRun(self, state, list(iterable) if type(iterable) is tuple else iterable, frame)
        state.loop = run
        return _MemoLoopContext(run, undefined) if undefined is not None else _PlainLoop(run)


def _loop_context(iterable, undefined, recurse=None, depth0=0):
    """Stands for LoopContext in the compiled template: a marked loop gets its memoised run."""
    if type(iterable) is _Marked:
        return iterable.spec.start(iterable, undefined, sys._getframe(1))
    return LoopContext(iterable, undefined, recurse, depth0)


def _walk_scoped(node: nodes.Node, visit, depth: int = 0) -> None:
    """Visit every node under `node`, telling `visit` whether it is at the loop's own level (depth 0) or inside a
    nested loop's body (where `loop`, break and continue are that loop's)."""
    for child in node.iter_child_nodes():
        visit(child, depth)
        if isinstance(child, nodes.For):
            for part in (child.target, child.iter):
                visit(part, depth)
                _walk_scoped(part, visit, depth)
            for part in [*child.body, *child.else_, *([child.test] if child.test else [])]:
                visit(part, depth + 1)
                _walk_scoped(part, visit, depth + 1)
        else:
            _walk_scoped(child, visit, depth)


def _is_length_of(expr: nodes.Node, name: str) -> bool:
    return isinstance(expr, nodes.Filter) and expr.name == "length" and isinstance(expr.node, nodes.Name) and \
        expr.node.name == name and not expr.args and not expr.kwargs and expr.dyn_args is None and \
        expr.dyn_kwargs is None


def _is_reversal(expr: nodes.Node) -> str | None:
    """The name X when `expr` is `X[::-1]`."""
    if isinstance(expr, nodes.Getitem) and isinstance(expr.node, nodes.Name) and isinstance(expr.arg, nodes.Slice):
        s = expr.arg
        step = s.step
        minus_one = (isinstance(step, nodes.Const) and type(step.value) is int and step.value == -1) or \
            (isinstance(step, nodes.Neg) and isinstance(step.node, nodes.Const) and type(step.node.value) is int
             and step.node.value == 1)
        if s.start is None and s.stop is None and minus_one:
            return expr.node.name
    return None


class _Refused(Exception):
    pass


def _reachable_macros(node: nodes.For, defined: list[nodes.Macro]) -> list[nodes.Macro]:
    """The macros the loop's body can call: those it names, and those they name, transitively. (A macro reached
    through a variable holding it is an outer name whose value is that macro; `_LoopRun` refuses one that is not
    among these.)"""
    by_name = {m.name: m for m in defined}
    reached: dict[str, nodes.Macro] = {}
    pending = [n.name for part in node.body for n in [part, *part.find_all(nodes.Name)]
               if isinstance(n, nodes.Name)]
    while pending:
        name = pending.pop()
        macro = by_name.get(name)
        if macro is not None and name not in reached:
            reached[name] = macro
            pending.extend(n.name for n in macro.find_all(nodes.Name))
    return list(reached.values())


class TextRender(NamedTuple):
    """A render's text and what is known of it: (the previous render's text in this thread, how many leading
    characters the two share at least)."""

    text: JoinedText
    known_prefix: tuple[JoinedText, int] | None


class IncrementalText:
    """The text render of one template, resuming its top-level loops over the messages (see the module doc).

    `render` returns None when the render must be done in full; `refusal` says why the template is outside the
    class (then no loop is memoised and `render` always returns None)."""

    def __init__(self, environment: jinja2.Environment, source: str) -> None:
        self.refusal: str | None = None
        self.loops: list[_LoopSpec] = []
        self.skipped: list[str] = []  # the top-level loops over the messages that run whole, and why
        self._local = threading.local()
        self.generation = 0
        self.executed = self.replayed = self.renders = self.fallbacks = self.raised = 0
        self.template: jinja2.Template | None = None
        try:
            self._build(environment, source)
        except _Refused as why:
            self.refusal = str(why)
            self.loops = []
            self.template = None

    def _build(self, environment: jinja2.Environment, source: str) -> None:
        env = environment.overlay()
        # The same globals (a later change to them shows through), but for the recording namespace.
        env.globals = ChainMap({"namespace": RecordingNamespace}, environment.globals)  # type: ignore[assignment]
        base_getattr = environment.getattr

        def getattr_(self_, obj, attribute):
            if type(obj) is _MemoLoopContext:
                obj.run.loop_read(attribute)
            return base_getattr(obj, attribute)

        env.getattr = types.MethodType(getattr_, env)  # type: ignore[method-assign]
        original = env.parse(source)
        marked = env.parse(source)
        if next(original.find_all((nodes.Extends, nodes.Block, nodes.Include, nodes.Import, nodes.FromImport)),
                None) is not None:
            raise _Refused("the template extends, includes or imports another one")
        for node in marked.find_all((nodes.Assign, nodes.AssignBlock, nodes.For, nodes.Macro, nodes.With)):
            targets = [node.target] if isinstance(node, (nodes.Assign, nodes.AssignBlock, nodes.For)) else \
                list(node.args) if isinstance(node, nodes.Macro) else list(node.targets)
            for target in targets:
                if any(n.name == "messages" for n in target.find_all(nodes.Name)) or \
                        (isinstance(target, nodes.Name) and target.name == "messages"):
                    raise _Refused(f"line {node.lineno} assigns `messages`")
        defined = list(marked.find_all(nodes.Macro))
        names = [m.name for m in defined]
        if len(set(names)) != len(names):
            raise _Refused("the template defines two macros of one name")
        reasons: list[str] = []
        for node in (n for n in marked.body if isinstance(n, nodes.For)):
            macros = _reachable_macros(node, defined)
            why = self._check_loop(node, macros)
            if why:
                reasons.append(f"the loop at line {node.lineno} {why}")
                continue
            backward = _is_reversal(node.iter) is not None
            spec = _LoopSpec(self, len(self.loops), node, self._outer_names(node, macros), backward,
                             self._length_is_position(node, macros), frozenset(m.name for m in macros))
            self.loops.append(spec)
        if not self.loops:
            raise _Refused("; ".join(reasons) or "no top-level loop")
        parser = Parser(env, source)
        markers: dict[str, _LoopSpec] = {}
        for spec in self.loops:
            name = parser.free_identifier(spec.node.lineno)
            name.name = f"drift_loop_{spec.index}"
            markers[name.name] = spec
            spec.node.iter = nodes.Call(name, [spec.node.iter], [], None, None, lineno=spec.node.lineno)
        plain = env.compile(original, raw=True)
        code = env.compile(marked, raw=True)
        self._check_same_code(plain, code, list(markers))
        template = env.template_class.from_code(env, compile(code, "<template>", "exec"), env.make_globals(None),
                                                None)
        namespace = template.root_render_func.__globals__
        namespace["LoopContext"] = _loop_context
        for name, spec in markers.items():
            namespace[name] = self._marker(spec)
        self.template = template
        self.skipped = reasons

    @staticmethod
    def _marker(spec: _LoopSpec):
        def mark(iterable):
            return _Marked(spec, iterable)

        return mark

    @staticmethod
    def _check_same_code(plain: str, code: str, markers: list[str]) -> None:
        """The marked template's Python must be the original's but for `environment.call(context, marker, X)` in
        place of X on each marked loop's line."""
        a, b = plain.splitlines(), code.splitlines()
        if len(a) != len(b):
            raise _Refused("marking its loops changed the compiled template")
        seen = 0
        for old, new in zip(a, b):
            if old == new:
                continue
            marker = next((m for m in markers if f"environment.call(context, {m}, " in new), None)
            if marker is None or not new.lstrip().startswith("for ") or seen >= len(markers):
                raise _Refused("marking its loops changed the compiled template")
            stripped = new.replace(f"environment.call(context, {marker}, ", "", 1)
            p = next((i for i, (x, y) in enumerate(zip(old, stripped)) if x != y), len(old))
            if stripped[p:p + 1] != ")" or stripped[p + 1:] != old[p:]:
                raise _Refused("marking its loops changed the compiled template")
            seen += 1
        if seen != len(markers):
            raise _Refused("marking its loops changed the compiled template")

    @staticmethod
    def _check_loop(node: nodes.For, macros: list[nodes.Macro]) -> str | None:
        if not isinstance(node.target, nodes.Name):
            return "unpacks its items"
        if node.recursive or node.else_ or node.test is not None:
            return "is recursive, filtered or has an else block"
        problems: list[str] = []
        allowed_loop: set[int] = set()
        allowed_messages: set[int] = set()
        scopes = [(part, True) for part in node.body] + [(m, False) for m in macros]

        def collect(child: nodes.Node, depth: int, own: bool) -> None:
            if isinstance(child, nodes.Getattr) and isinstance(child.node, nodes.Name) and child.node.name == "loop" \
                    and child.attr in _LOOP_ATTRIBUTES and depth == 0 and own:
                allowed_loop.add(id(child.node))
            if isinstance(child, nodes.Getitem) and isinstance(child.node, nodes.Name) and \
                    child.node.name == "messages" and not isinstance(child.arg, nodes.Slice):
                allowed_messages.add(id(child.node))
            if _is_length_of(child, "messages"):
                allowed_messages.add(id(child.node))

        def check(child: nodes.Node, depth: int, own: bool) -> None:
            if isinstance(child, _REFUSED_NODES):
                problems.append(f"uses {type(child).__name__} (line {child.lineno})")
            elif isinstance(child, (nodes.Break, nodes.Continue)) and depth == 0 and own:
                problems.append(f"breaks or continues itself (line {child.lineno})")
            elif isinstance(child, nodes.Name):
                if child.name in _IMPURE_NAMES:
                    problems.append(f"reads {child.name} (line {child.lineno})")
                elif child.name == "loop" and depth == 0 and own and id(child) not in allowed_loop:
                    problems.append(f"reads loop other than by a plain attribute (line {child.lineno})")
                elif child.name == "messages" and id(child) not in allowed_messages:
                    problems.append(f"reads messages other than by index or length (line {child.lineno})")
            elif isinstance(child, nodes.Filter) and child.name in _IMPURE_FILTERS:
                problems.append(f"uses the {child.name} filter (line {child.lineno})")

        for part, own in scopes:
            for visit in (collect, check):
                visit(part, 0, own)
                _walk_scoped(part, lambda child, depth, v=visit, o=own: v(child, depth, o))
        return problems[0] if problems else None

    @staticmethod
    def _outer_names(node: nodes.For, macros: list[nodes.Macro]) -> list[str]:
        names: set[str] = set()
        for part in [*node.body, *macros]:
            names.update(n.name for n in part.find_all(nodes.Name) if n.ctx == "load")
            names.update(n.name for n in part.find_all(nodes.NSRef))  # `set ns.x = ...` writes namespace ns
            if isinstance(part, nodes.Name) and part.ctx == "load":
                names.add(part.name)
        names.discard("messages")
        names.discard(node.target.name)
        if not any(n.name == "loop" for m in macros for n in m.find_all(nodes.Name)):
            names.discard("loop")  # the body's own `loop` (a macro's would be a variable of the context)
        return sorted(names)

    @staticmethod
    def _length_is_position(node: nodes.For, macros: list[nodes.Macro]) -> bool:
        """A backward loop over `messages[::-1]` whose body reads `loop.index0` and `messages|length` only as
        `(messages|length - 1) - loop.index0`, the item's position in `messages`, and whose macros never read
        `messages`: such reads depend on the position alone."""
        if _is_reversal(node.iter) != "messages":
            return False
        if any(n.name == "messages" for m in macros for n in m.find_all(nodes.Name)):
            return False
        inside: set[int] = set()
        for part in node.body:
            for sub in [part, *part.find_all(nodes.Sub)]:
                if isinstance(sub, nodes.Sub) and isinstance(sub.left, nodes.Sub) and \
                        _is_length_of(sub.left.left, "messages") and isinstance(sub.left.right, nodes.Const) and \
                        sub.left.right.value == 1 and isinstance(sub.right, nodes.Getattr) and \
                        isinstance(sub.right.node, nodes.Name) and sub.right.node.name == "loop" and \
                        sub.right.attr == "index0":
                    inside.update((id(sub.left.left.node), id(sub.right)))
        for part in node.body:
            for sub in [part, *part.find_all((nodes.Name, nodes.Getattr))]:
                if isinstance(sub, nodes.Name) and sub.name == "messages" and id(sub) not in inside:
                    return False
                if isinstance(sub, nodes.Getattr) and isinstance(sub.node, nodes.Name) and \
                        sub.node.name == "loop" and sub.attr in ("index0", "index", "length", "revindex",
                                                                 "revindex0") and id(sub) not in inside:
                    return False
        return bool(inside)

    # -- rendering --------------------------------------------------------------------------------------------

    def _memo(self) -> dict[int, list[_Run]]:
        local = self._local
        if getattr(local, "generation", None) != self.generation:
            local.generation, local.memo, local.last = self.generation, {}, None
        return local.memo

    def clear(self) -> None:
        """Forget every thread's records (each notices the new generation) and the counts."""
        self.generation += 1
        self.executed = self.replayed = self.renders = self.fallbacks = self.raised = 0

    def render(self, chat: list[dict], variables: dict) -> TextRender | None:
        """The template's text for these messages and variables, or None: render it in full."""
        template = self.template
        if template is None:
            return None
        messages = RecordedMessages(chat)
        state = _RenderState(messages)
        previous, _ACTIVE.render = _ACTIVE.render, state
        context = None
        try:
            context = template.new_context({**variables, "messages": messages})
            out = state.out
            for chunk in template.root_render_func(context):
                out.append(chunk)
        except Exception:  # noqa: BLE001 (the full render raises it again, and it becomes a RenderError)
            self.raised += 1
            return None
        finally:
            _ACTIVE.render = previous
            # The render's reference cycles (a macro's closure holds the context that holds the macro; the loops
            # and the state hold each other), broken so that refcounting frees a render's lists at once, not the
            # garbage collector, which would walk each history-long list again at every collection.
            if context is not None:
                context.vars.clear()
                context.exported_vars.clear()
            loops, state.loop, state.record = list(state.finished), None, None
            state.finished.clear()
        self.renders += 1
        if state.refused is not None:
            self.fallbacks += 1
            return None
        memo = self._memo()
        for loop in loops:
            index = loop.spec.index
            kept = [r for r in memo.get(index, ()) if r is not loop.old]
            memo[index] = [loop.finished_run(), *kept][:4]
        self.executed += state.executed
        self.replayed += state.replayed
        pieces = state.out  # each iteration, executed or replayed, is one piece: the same from render to render
        # The text as its pieces (Jinja's concat is a join), joined when read whole.
        text = JoinedText(pieces, sum(map(len, pieces)))
        last, self._local.last = self._local.last, (pieces, text)
        if last is None:
            return TextRender(text, None)
        # The pieces this render has in common with the previous one (mostly the same objects: replayed records)
        # say how far the two texts agree, without reading the characters of a history of any length.
        agreeing = common_prefix_from_end(last[0], pieces)
        return TextRender(text, (last[1], len(text) - sum(map(len, pieces[agreeing:]))))

    def stats(self) -> dict[str, int]:
        return {"loops_memoised": len(self.loops), "loops_in_full": list(self.skipped), "renders": self.renders,
                "fell_back": self.fallbacks, "raised": self.raised, "iterations_executed": self.executed,
                "iterations_replayed": self.replayed}
