"""Jinja chat templates rendered exactly as transformers' `apply_chat_template`, with per-character provenance.

Parity comes from reusing transformers' own pieces at run time (its sandboxed environment with `tojson`,
`raise_exception`, `strftime_now`, `dict`, `namespace`, and its message normalisation). Provenance comes from
compiling the same template source in an overlay of that environment whose code generator wraps every output
expression in a recorder call; the overlay differs only in code generation, and the parity test proves the
strings are identical.

The text comes first, from the same source compiled in a second overlay whose sandbox remembers its verdicts
(`_remember_sandbox_verdicts`: same answers, asked once per type and name); the recording render runs only when a
caller first reads `message_index` or `source_line`, since most prompts are only compared as text
(`engine.types.Rendered`). It checks that it produced the same text. The plain text render itself resumes the
template's loops over the messages from an earlier render where that is proven equal (`engine.render.incremental`),
and is the full render of that overlay otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jinja2  # noqa: E402
from jinja2 import nodes  # noqa: E402
from jinja2.compiler import CodeGenerator, Frame  # noqa: E402

from engine.errors import RenderError  # noqa: E402
from engine.prefix import JoinedText  # noqa: E402
from engine.render.cache import request_key  # noqa: E402
from engine.render.constructs import (  # noqa: E402
    ConstructTable,
    Evaluation,
    InstrumentedTemplate,
    message_in_frame,
)
from engine.render.incremental import IncrementalText  # noqa: E402
from engine.types import Provenance, Rendered, RenderRequest  # noqa: E402

T = TypeVar("T")
COUNTERFACTUAL_MEMO = 4096  # counterfactual renders kept per template (the default matrix makes about 3,000)


def transformers_pieces():
    # Imported lazily: transformers takes a second to import and only rendering needs it.
    from transformers.utils import chat_template_utils as ctu

    return ctu


_DICT_ATTRIBUTES = frozenset(dir(dict))


def _remember_sandbox_verdicts(environment: jinja2.Environment) -> None:
    """Make a sandboxed environment answer its attribute checks from memory, with the same answers.

    Jinja's sandbox asks `is_safe_attribute(obj, attr, value)` on every `message.role`; for the immutable sandbox
    transformers uses, the answer depends only on the object's type and the name (`is_internal_attribute` and
    `modifies_known_mutable` test `isinstance` and the name, never the value). And `message.role` on a plain dict
    first tries Python's getattr, which raises, then the item: for a name that is not a dict attribute that is
    exactly the item lookup.
    """
    decide = environment.is_safe_attribute
    verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj, attr: str, value) -> bool:
        key = (type(obj), attr)
        verdict = verdicts.get(key)
        if verdict is None:
            verdict = verdicts[key] = decide(obj, attr, value)
        return verdict

    sandboxed_getattr = environment.getattr

    def getattr_(self, obj, attribute: str):
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        return sandboxed_getattr(obj, attribute)

    environment.is_safe_attribute = is_safe_attribute  # type: ignore[method-assign]
    environment.getattr = types.MethodType(getattr_, environment)  # type: ignore[method-assign]


class _ProvenanceCodeGenerator(CodeGenerator):
    """Emits `environment.drift_record(lineno, is_root, value)` around every output expression.

    Constant folding of adjacent outputs is switched off so that each output keeps its own template line.
    """

    def _output_child_to_const(self, node, frame, finalize):  # type: ignore[override]
        raise nodes.Impossible()

    def _output_child_pre(self, node: nodes.Expr, frame: Frame, finalize) -> None:  # type: ignore[override]
        self.write(f"environment.drift_record({node.lineno}, {frame.buffer is None}, ")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: nodes.Expr, frame: Frame, finalize) -> None:  # type: ignore[override]
        super()._output_child_post(node, frame, finalize)
        self.write(")")


@dataclass
class _Record:
    line: int
    text: str
    children: list[_Record]


class _Recorder(threading.local):
    def __init__(self) -> None:
        self.pending: list[_Record] = []
        self.chunks: list[tuple[_Record, int]] = []  # (record tree, message index)
        self.message_ids: dict[int, int] = {}


def _leaves(record: _Record) -> list[tuple[int, str]]:
    if not record.children:
        return [(record.line, record.text)]
    out: list[tuple[int, str]] = []
    for child in record.children:
        out.extend(_leaves(child))
    return out


class JinjaRenderer:
    """One chat template, rendered as transformers renders it."""

    def __init__(self, source: str, *, model: str, source_path: str, special_tokens: dict[str, str] | None = None):
        self.model = model
        self.source_path = source_path
        self.origin = f"template {model}"
        self._source = source
        self.template_source = source  # what an engine's request side reads (content format, template kwargs)
        # transformers passes the tokenizer's special tokens (bos_token, eos_token, ...) to every render.
        self._special_tokens = dict(special_tokens or {})
        # transformers' environment, built as apply_chat_template builds it (the same for every source), anew for this
        # template: the source is compiled once, in our own overlay of it (compiling it in transformers' as well was a
        # tenth of a model's load; the naive baseline and parity compile theirs through transformers when they run).
        environment = transformers_pieces()._cached_compile_jinja_template("").environment
        fast = environment.overlay()
        _remember_sandbox_verdicts(fast)
        try:
            self._text_template = fast.from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise RenderError(
                f"{source_path} for model {model} does not parse: {err.message} (line {err.lineno})",
                model=model,
                path=source_path,
                source_line=err.lineno,
            ) from err
        self._incremental_built: IncrementalText | None = None  # built on the first plain render (50-200 ms)
        self._incremental_lock = threading.Lock()
        self._conversions = threading.local()  # _template_messages: the previous request's messages, per thread
        self._reference_environment = environment
        self._recorder = _Recorder()
        self._message_memo: dict[bytes, dict] = {}  # _template_messages: message pickle -> template's message
        self._recording_built: jinja2.Template | None = None  # compiled when provenance is first read
        self._recording_lock = threading.Lock()
        self._instrumented_template: InstrumentedTemplate | None = None
        self._counterfactual_context: tuple | None = None
        self._counterfactuals: OrderedDict = OrderedDict()

    @property
    def _recording(self) -> jinja2.Template:
        """The template compiled to record which line printed each character (a third of a model's load time, and
        only a cell's detail reads provenance)."""
        if self._recording_built is None:
            with self._recording_lock:
                if self._recording_built is None:
                    overlay = self._reference_environment.overlay()
                    _remember_sandbox_verdicts(overlay)
                    overlay.code_generator_class = _ProvenanceCodeGenerator
                    overlay.drift_record = self._record  # type: ignore[attr-defined]
                    self._recording_built = overlay.from_string(self._source)
        return self._recording_built

    @property
    def _incremental(self) -> IncrementalText:
        """The same template resuming its loops over the messages from an earlier render
        (engine.render.incremental)."""
        if self._incremental_built is None:
            with self._incremental_lock:
                if self._incremental_built is None:
                    self._incremental_built = IncrementalText(self._text_template.environment, self._source)
        return self._incremental_built

    def source_lines(self) -> list[str]:
        return self._source.splitlines()

    @property
    def persisted_identity(self) -> bytes | None:
        """What this template's text depends on besides the request, for a store that keeps prompts across runs
        (engine.render_store): the sha256 of its source and the special tokens it is given. None for a template that
        can render one request two ways (it reads the clock with `strftime_now`, or draws with `random` or
        `lipsum`), and for a subclass that watches every output (the sandbox's limits run on every render)."""
        if self._records_every_output or any(name in self._source for name in ("strftime_now", "random", "lipsum")):
            return None
        return hashlib.sha256(json.dumps([self._source, sorted(self._special_tokens.items())],
                                         ensure_ascii=True).encode()).digest()

    def stored(self, text: str, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
               kwargs: dict | None = None) -> Rendered:
        """The prompt of a request this template rendered in an earlier run, as its text was kept
        (`persisted_identity`); which message and line produced each character is recorded when first read, from
        the request as it is now (a message is not changed in place once rendered: `_template_messages`)."""
        def provenance() -> Provenance:
            return self._provenance_of(text, *self.template_context(messages, tools, add_generation_prompt, kwargs))

        return Rendered(text=text, source_path=self.source_path, origin=self.origin, provenance=provenance)

    def _instrumented(self) -> InstrumentedTemplate:
        # Compiled on first use (20-50 ms): only cause attribution renders through it.
        if self._instrumented_template is None:
            self._instrumented_template = InstrumentedTemplate(self._text_template.environment, self._source)
        return self._instrumented_template

    def construct_table(self) -> ConstructTable:
        """Every construct of the template that can change a message's text, and its assignments
        (engine.render.constructs)."""
        return self._instrumented().table

    def render_counterfactual(self, request: RenderRequest, *, undo_from: int | None = None,
                              undo: frozenset[int] = frozenset(),
                              substitute: dict[int, dict[str, str]] | None = None
                              ) -> tuple[str, list[Evaluation]]:
        """The prompt with the constructs `undo` undone (and ops in `substitute` giving other text) from message
        `undo_from` on, and, when nothing is changed, every construct's runs."""
        # Blame renders one request once per candidate, and the engines' columns often send the same request: the
        # template context is built once per request, each counterfactual rendered once.
        key = (request_key(request.messages, request.tools, request.add_generation_prompt, request.kwargs),
               undo_from, frozenset(undo), tuple(sorted((k, tuple(sorted(v.items())))
                                                         for k, v in (substitute or {}).items())))
        memo = self._counterfactuals
        found = memo.get(key)
        if found is not None:
            with contextlib.suppress(KeyError):  # another thread (the web app) may have evicted it meanwhile
                memo.move_to_end(key)
            return found
        cached = self._counterfactual_context
        if cached is None or cached[0] != key[0]:
            cached = self._counterfactual_context = (key[0], *self.template_context(
                request.messages, request.tools, request.add_generation_prompt, request.kwargs))
        _, chat, variables = cached
        result = self._guarded(lambda: self._instrumented().render(chat, variables, undo_from=undo_from, undo=undo,
                                                                   substitute=substitute))
        memo[key] = result
        if len(memo) > COUNTERFACTUAL_MEMO:
            with contextlib.suppress(KeyError):
                memo.popitem(last=False)
        return result

    def _record(self, line: int, is_root: bool, value: str) -> str:
        rec = self._recorder
        text = str(value)
        node = _Record(line, text, [])
        # Records arrive in post-order: a macro's outputs are recorded before the call that returns them.
        # Adopt the most recent pending records when they concatenate to exactly this value.
        pending = rec.pending
        joined = ""
        for k in range(len(pending) - 1, -1, -1):
            joined = pending[k].text + joined
            if len(joined) > len(text):
                break
            if joined == text and text:
                node.children = pending[k:]
                del pending[k:]
                break
        if is_root:
            rec.pending = []
            rec.chunks.append((node, self._message_in_frame(sys._getframe(1))))
        else:
            pending.append(node)
        return value

    def _message_in_frame(self, frame) -> int:
        found = message_in_frame(frame, self._recorder.message_ids)
        return -1 if found is None else found

    def template_context(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                         kwargs: dict | None) -> tuple[list[dict], dict]:
        """The messages and variables exactly as transformers hands them to the template."""
        ctu = transformers_pieces()
        chat = self._template_messages(messages)
        variables = {**self._special_tokens, **ctu._plain_template_data(dict(kwargs or {}))}
        variables.update(
            tools=ctu._plain_template_data(tools), documents=None, add_generation_prompt=add_generation_prompt
        )
        return chat, variables

    def cache_clear(self) -> None:
        """Forget the converted messages (`_template_messages`), the incremental render's records and the
        counterfactual renders, for a measurement that starts cold."""
        self._message_memo.clear()
        self._conversion_generation += 1
        if self._incremental_built is not None:
            self._incremental_built.clear()
        self._counterfactuals.clear()
        self._counterfactual_context = None

    _conversion_generation = 0

    def incremental_stats(self) -> dict[str, Any]:
        """How the plain text renders went: through the incremental path (iterations executed, replayed) or in
        full, and why a template is outside the incremental path's class (`refusal`)."""
        return {"refusal": self._incremental.refusal, **self._incremental.stats()}

    def _template_messages(self, messages: list[dict]) -> list[dict]:
        """transformers' `_normalize_chat_messages`, `_plain_template_data` and `_alias_reasoning_fields` on the
        messages, each message converted once: the three act on each message alone, and a session of N requests
        hands the same earlier messages over N times.

        Each position gets its own top-level copy (the recording render tells messages apart by identity), and
        keeps it from one request to the next (per thread) while the caller hands over the same message object at
        that position, or one with the same pickle (`request_key`: equal only for messages that render alike):
        so a request costs what is new in it, and the incremental render sees the same objects again. A message
        object must therefore not be changed in place once rendered (the library builds a new one, as a session's
        rewrites do). The sandbox is immutable, so the nested values can be shared. Anything but a list of dicts
        takes transformers' path.
        """
        ctu = transformers_pieces()
        if not isinstance(messages, list):
            return ctu._alias_reasoning_fields(ctu._plain_template_data(ctu._normalize_chat_messages(messages)))
        local = self._conversions
        if getattr(local, "generation", None) != self._conversion_generation:
            local.generation, local.sent, local.chat, local.keys = self._conversion_generation, [], [], []
        sent, chat, keys = local.sent, local.chat, local.keys  # this thread's own: changed in place
        local.sent = []  # until this call is through (a conversion may raise): then only keys match positions
        # Which positions hold the objects of the previous call (usually all of them, checked at C speed).
        same = [True] * min(len(messages), len(sent)) if all(map(operator.is_, messages, sent)) else \
            list(map(operator.is_, messages, sent))
        del chat[len(messages):], keys[len(messages):]
        memo = self._message_memo
        if len(memo) > 16384:
            memo.clear()
        position = _first_false(same, 0)
        while position < len(messages):
            message = messages[position]
            if type(message) is not dict:
                return ctu._alias_reasoning_fields(ctu._plain_template_data(ctu._normalize_chat_messages(messages)))
            key = request_key([message], None, False, None)
            if position < len(keys) and isinstance(key, bytes) and keys[position] == key:
                pass  # another object, the same message: keep this position's copy
            else:
                converted = memo.get(key) if isinstance(key, bytes) else None
                if converted is None:
                    converted = ctu._alias_reasoning_fields(ctu._plain_template_data(
                        ctu._normalize_chat_messages([message])))[0]
                    if isinstance(key, bytes):
                        memo[key] = converted
                if position < len(chat):
                    chat[position], keys[position] = dict(converted), key
                else:
                    chat.append(dict(converted))
                    keys.append(key)
            position += 1
            if position < len(same):
                position = _first_false(same, position)
        local.sent = list(messages)
        return list(chat)

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
               kwargs: dict | None = None) -> Rendered:
        chat, variables = self.template_context(messages, tools, add_generation_prompt, kwargs)
        if self._records_every_output:
            # A subclass watching every output through `_record` (the sandbox's output-size limit) needs the
            # recording render itself, and reads the provenance right after anyway.
            return self._render_recorded(chat, variables)
        incremental = self._incremental.render(chat, variables)
        if incremental is None:  # outside the incremental path's class, or it could not record this render: in full
            text, known_prefix = self._guarded(lambda: self._text_template.render(messages=chat, **variables)), None
        else:
            text, known_prefix = incremental
        # `chat` and `variables` are fresh plain copies (template_context), so the caller's later edits to its
        # messages cannot reach the recording render.
        return Rendered(text=text, source_path=self.source_path, origin=self.origin,
                        provenance=lambda: self._provenance_of(text, chat, variables), known_prefix=known_prefix)

    @property
    def _records_every_output(self) -> bool:
        return type(self)._record is not JinjaRenderer._record

    def _guarded(self, run: Callable[[], T]) -> T:
        """Run one render; a template's failure becomes RenderError naming the file, the model, the line."""
        try:
            return run()
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError,
                OverflowError, ZeroDivisionError, MemoryError) as err:
            line = template_line_of(err)
            where = f" at line {line}" if line else ""
            # A template's own error (raise_exception, undefined) reads as itself; a Python error names its type.
            what = f"raised{where}: {err}" if isinstance(err, jinja2.TemplateError) else \
                f"failed{where}: {type(err).__name__}: {err}"
            raise RenderError(f"{self.source_path} for model {self.model} {what}", model=self.model,
                              path=self.source_path, source_line=line) from err

    def _render_recorded(self, chat: list[dict], variables: dict) -> Rendered:
        rec = self._recorder
        rec.pending, rec.chunks = [], []
        rec.message_ids = {id(m): i for i, m in enumerate(chat)}

        def run() -> None:
            for _ in self._recording.generate(messages=chat, **variables):
                pass

        self._guarded(run)
        return self._assemble(rec.chunks, chat)

    def _provenance_of(self, text: str | JoinedText, chat: list[dict], variables: dict) -> Provenance:
        recorded = self._render_recorded(chat, variables)
        if recorded.text != str(text):
            # Only a template that reads the clock or draws random numbers can render differently twice.
            raise RenderError(f"{self.source_path} for model {self.model} rendered different text when run again "
                              "to record which message and line produced each character (does it read the clock "
                              "or use random?), so the prompt has no per-character provenance",
                              model=self.model, path=self.source_path)
        return recorded.message_index, recorded.source_line

    def _assemble(self, chunks: list[tuple[_Record, int]], chat: list[dict]) -> Rendered:
        parts: list[str] = []
        message_index: list[int] = []
        source_line: list[int] = []
        for record, msg in chunks:
            for line, text in _leaves(record):
                parts.append(text)
                source_line.extend([line] * len(text))
            message_index.extend([msg] * len(record.text))
        text = "".join(parts)
        return Rendered(
            text=text,
            message_index=tuple(message_index),
            source_line=tuple(source_line),
            source_path=self.source_path,
            origin=self.origin,
        )

    def render_reference(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool,
                         kwargs: dict | None = None) -> str:
        """transformers' own rendering of the same inputs, for the parity test."""
        ctu = transformers_pieces()
        chat = ctu._normalize_chat_messages(messages)
        rendered, _ = ctu.render_jinja_template(
            conversations=[chat],
            tools=tools,
            chat_template=self._source,
            add_generation_prompt=add_generation_prompt,
            **self._special_tokens,
            **(kwargs or {}),
        )
        return rendered[0]


def _first_false(flags: list[bool], start: int) -> int:
    try:
        return flags.index(False, start)
    except ValueError:
        return len(flags)


def template_line_of(err: BaseException) -> int | None:
    """The template line active where `err` was raised.

    Jinja rewrites tracebacks so that frames of compiled templates carry the template's own line numbers.
    """
    tb = err.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
