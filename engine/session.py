"""A whole agent task as a chain of requests: what each request reuses from the prefix cache and what it prefills.

The accounting follows the inference handbook (seed 003): request k's prompt is compared with the whole sequences
(prompt plus generation, rendered with add_generation_prompt=False) of the requests before it; the longest common
token prefix is what a prefix cache holding the session can reuse. In an append-only session every earlier sequence
is a prefix of the previous one, so this is the handbook's "common prefix with the previous request's sequence".
Two cache designs refine it: block-granular reuse (only whole blocks are cached, hashed with their parent, as
vLLM's automatic prefix caching, seed 004; block size 1 is SGLang's token-level radix tree) and a hybrid
(linear-attention) model whose state exists only at checkpoints, by default the end of each prompt and of each
generation; a checkpoint counts only where the sequence it was taken in still agrees with the new prompt.

Plain data in and out:

- `SessionScript`: one scripted agent task read from `scenarios/sessions/<name>.json`: tools, system prompt, the
  user/tool messages and the scripted assistant replies between them (`steps`), template kwargs, two unrelated
  questions and a timestamp pattern for the cross-session experiments, and optional `what_if` settings
  (`summary` {step, from_request, content}, `added_tool`, `tools_change_request`).
- `CachedSequence` / `Reuse`: the pure accounting. `reuse_of(prompt_ids, cached, block_size)` says how many tokens a
  prompt reuses at token, block and hybrid granularity from the sequences a cache holds, for any id sequences.
  `ReuseIndex` gives the same figures for a cache that gains one sequence per request, each request costing what
  is new in it (the simulator's way: a 1,000-call session would otherwise compare every prompt with every earlier
  sequence, token by token).
- `Counts`: prompt / reusable / prefill / decode tokens of one request (or a total) under one accounting
  ("token", "block" or "hybrid", see `ACCOUNTINGS`).
- `RequestRow`: one request: its counts under all three accountings (`counts(accounting)`), the length of the
  previous request's sequence, which earlier request's sequence the reuse comes from (`matched_request`), and the
  rendered prompt/sequence (`Rendered`, with per-character message index and template line) and their tokens
  (`Tokens`, ids with character offsets), built only when a view reads them (`RequestViews`): the session itself
  keeps each request's text and ids as what they add to the one before (`engine.prefix.SharedSequence`), and
  tokenizes each text reusing the ids of what it shares with the one before
  (`engine.tokenize.tokenize_extending`). `breaks` is true when the reuse is short of the whole previous sequence.
- `SessionReport`: all rows plus the settings (kwargs, block size, checkpoint policy, history mode, rewrites);
  `totals(accounting)` sums a column, `to_json()` is the CLI's JSON.
- `BreakView` (from `break_view(report, index)`): for a request that breaks, the sequence it is compared with and
  the next prompt (text, provenance, token ids and offsets), the first differing token and character, where the
  differing token starts, and the template line (`engine.types.Location`) that emitted the differing character on
  each side: what a page needs to open the same break view as a matrix cell.
- `StepRewrite` / `ToolsChange`: the history rewritten mid-way: from request k on, a step's content is replaced
  (a tool result summarised) or the tool list changes.
- `WhatIfRequest` / `WhatIfResult`: one what-if experiment: per request the prompt and the reused tokens before
  and after the switch (token, block and hybrid), totals, a one-line description with the figures, and the two
  `SessionReport`s when the experiment is a whole session. `WHAT_IFS` is the registry by name (`what_if_names()`,
  `run_what_if(name, ...)`).

History modes: "template" re-renders every request from the messages, as clients do; "append" keeps the history
as first rendered, each prompt being the previous request's whole sequence plus what the template renders for the
new messages and the generation prompt (the handbook's own way to answer its exercise for a template without a
preserve switch).

Engines (`engine=` "raw", "vllm", "sglang", or "engine@version"; None = the template alone, the handbook's way): the
session goes the way production goes, as a matrix cell does (engine.simulate). Each scripted reply becomes the
model's output text (engine/formats/<family>.py `write`, stop token included), the engine's parsers turn it into
the message the client sends back (`raw`: the format's lossless split), and the engine's request side rewrites each
next request before the template renders it. This changes the accounting: a request's sequence, what the cache
holds after generation, is its prompt's ids plus the tokenization of the written completion (not the template's
rendering of the reply with add_generation_prompt=False), and decode is the completion's tokens, stop token
included. With Qwen3.5 on the handbook the written completion (`reasoning\n</think>\n\n`, the tool call, then
`<|im_end|>`, after the prompt's `<think>\n`) is byte for byte what the template renders for the latest turn, but
the template also renders the `\n` after `<|im_end|>`, which the model never generates: each decode is one token
less and that newline is prefilled by the next request instead of reused. Each row carries the parser's edits of
its reply (`parse_edits`) and the request side's edits of its prompt (`request_edits`). History "append" runs
without an engine; a what-if runs both its sides through `SessionSettings.engine` (history-kept only when a template
kwarg keeps the history, since its fallback is the append-only history).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.call_ids import SessionCallIds
from engine.client import client_call_ids, client_message
from engine.errors import ExplorerError, RenderError
from engine.formats import AssistantTurn, Completion, get_format
from engine.formats.base import tool_call_specs
from engine.models import LoadedModel
from engine.prefix import SharedSequence, common_prefix, shared_common_prefix
from engine.serving.raw import raw_request
from engine.serving.registry import get_engine, list_engines, parse_served, serving_engine
from engine.serving.spec import EngineSpec
from engine.simulate import reasoning_forced, turn_as_written
from engine.tokenize import TokenizedText, Tokenizer, known_agreement, token_ids, tokenize_extending
from engine.types import Edit, Location, ParseResult, Rendered, Tokens

SESSIONS_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "sessions"

ACCOUNTINGS = ("token", "block", "hybrid")
CHECKPOINT_POLICIES = ("prompt-and-generation-end", "generation-end", "none")
HISTORY_MODES = ("template", "append")
STEP_ROLES = ("user", "assistant", "tool")


@dataclass(frozen=True)
class SessionScript:
    id: str
    description: str
    tools: list[dict] | None
    system: str
    steps: list[dict]  # user / tool messages, and the scripted assistant replies between them
    kwargs: dict[str, Any] = field(default_factory=dict)
    unrelated_questions: tuple[str, ...] = ()
    timestamp_template: str = ""
    timestamp_seconds: tuple[int, ...] = ()
    what_if: dict[str, Any] = field(default_factory=dict)  # settings for the what-if experiments
    source: str = ""  # the file it was read from

    @property
    def request_steps(self) -> list[int]:
        """Indexes into `steps` of the messages that each start a request (every user or tool message)."""
        return [i for i, m in enumerate(self.steps) if m["role"] != "assistant"]


def session_ids() -> list[str]:
    return sorted(p.stem for p in SESSIONS_DIR.glob("*.json"))


def load_session(name_or_path: str) -> SessionScript:
    """A session script by built-in name or path: JSON under the upload text cap, at most MAX_SESSION_STEPS steps
    (DRIFT_SESSION_MAX_STEPS, default 200), each problem one sentence."""
    from engine.uploads import UploadLimits, json_document, read_path

    path = Path(name_or_path)
    if name_or_path in session_ids():
        path = SESSIONS_DIR / f"{name_or_path}.json"
    elif not path.exists():
        known = ", ".join(session_ids())
        raise ExplorerError(f"no session script {name_or_path!r}: not a file, and not one of {known}")
    limits = UploadLimits.from_env()
    data = read_path(path, "a session script", limits.max_text_bytes, limits.cap_setting("tokenizer_config"))
    try:
        raw = json_document(data, str(path))
    except ExplorerError as err:
        raise ExplorerError(f"session script {path} is malformed: {err}") from None
    if not isinstance(raw, dict):
        raise ExplorerError(f"session script {path} is malformed: it must be a JSON object")
    most = max_session_steps()
    if isinstance(raw.get("steps"), list) and len(raw["steps"]) > most:
        raise ExplorerError(f"session script {path} has {len(raw['steps'])} steps, over the limit of {most} "
                            f"({MAX_STEPS_ENV})")
    return session_from_json(raw, str(path))


def session_from_json(raw: Any, source: str) -> SessionScript:
    """A session script from its JSON data (what `load_session` reads from `source`)."""
    try:
        stamp = raw.get("timestamp", {})
        script = SessionScript(
            id=raw.get("id", Path(source).stem),
            description=raw.get("description", ""),
            tools=raw.get("tools"),
            system=raw.get("system", ""),
            steps=list(raw["steps"]),
            kwargs=dict(raw.get("kwargs", {})),
            unrelated_questions=tuple(raw.get("unrelated_questions", ())),
            timestamp_template=stamp.get("template", ""),
            timestamp_seconds=tuple(stamp.get("seconds", ())),
            what_if=dict(raw.get("what_if", {})),
            source=source,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise ExplorerError(f"session script {source} is malformed: {err}") from err
    for i, step in enumerate(script.steps):
        if not isinstance(step, dict) or step.get("role") not in STEP_ROLES:
            raise ExplorerError(f"session script {source}: step {i} must be a message whose role is one of "
                                f"{', '.join(STEP_ROLES)}, got {_short_repr(step)}")
        if not isinstance(step.get("content", ""), str | type(None)):
            raise ExplorerError(f"session script {source}: step {i}'s content must be a string, not "
                                f"{type(step['content']).__name__}")
    if not script.request_steps:
        raise ExplorerError(f"session script {source} has no user or tool message, so it makes no request")
    return script


MAX_STEPS_ENV = "DRIFT_SESSION_MAX_STEPS"


def max_session_steps() -> int:
    """The most steps a session script may hold: each request re-renders and re-tokenizes the whole history."""
    raw = os.environ.get(MAX_STEPS_ENV, "").strip()
    if not raw:
        return 200
    if not raw.isdigit() or int(raw) < 1:
        raise ExplorerError(f"environment variable {MAX_STEPS_ENV} must be a whole number greater than 0, got {raw!r}")
    return int(raw)


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        text = f"a nested {type(value).__name__}"
    return text[:80]


# ---------------------------------------------------------------------------------------------------------------
# The pure accounting


@dataclass(frozen=True)
class CachedSequence:
    """A sequence a prefix cache holds (a request's prompt plus generation) and where a hybrid model kept state."""

    ids: tuple[int, ...]
    checkpoints: tuple[int, ...]


@dataclass(frozen=True)
class Reuse:
    token: int  # longest common prefix with any cached sequence
    block: int  # the whole blocks inside it
    hybrid: int  # the furthest checkpoint still valid for this prompt
    matched: int  # index into `cached` of the sequence giving `token` (-1: nothing cached)


def block_reusable(common: int, block_size: int) -> int:
    """Tokens a block-granular cache reuses: only whole blocks inside the common prefix.

    A block's key hashes its parent's key and its own tokens, so block b hits only if blocks 0..b all lie in the
    common prefix; the block holding the first differing token, and all after it, are recomputed.
    """
    return (common // block_size) * block_size


def reuse_of(prompt_ids: Sequence[int], cached: Sequence[CachedSequence], block_size: int) -> Reuse:
    """What `prompt_ids` reuses from a cache holding `cached` (no eviction), at token, block and hybrid granularity.

    A hybrid model's checkpoint at position c of a sequence is usable only if that sequence agrees with the prompt
    through c: the linear-attention state sums up the whole prefix before it.
    """
    prompt = tuple(prompt_ids)  # a list never equals a tuple slice, so compare tuples with tuples
    token, hybrid, matched = 0, 0, -1
    for j, sequence in enumerate(cached):
        common = common_prefix(prompt, tuple(sequence.ids))
        if common >= token:  # ties go to the latest sequence, the one a break view compares with
            token, matched = common, j
        hybrid = max(hybrid, max((c for c in sequence.checkpoints if c <= common), default=0))
    return Reuse(token, block_reusable(token, block_size), hybrid, matched)


class ReuseIndex:
    """`reuse_of` for a cache that gains one sequence per request, each prompt costing what is new in it.

    `reuse(prompt)` then `add(sequence, checkpoints)` per request (ids as any sequence of ints, or as the session's
    `SharedSequence`s). It keeps, for the latest cached sequence A, lcp(A, S) with every cached sequence S. A prompt
    P is compared with A directly (P usually extends A, so only from where it stops sharing A's ids); for every
    other S, lcp(P, S) = min(lcp(P, A), lcp(A, S)) when the two differ, and only where they are equal, with both P
    and S going on past that point, are P and S compared, from there. The sequence added is placed the same way
    through the prompt just measured. Same figures as `reuse_of` over the same sequences
    (tests/test_session_blocks.py checks it on random ones).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.sequences: list[SharedSequence] = []
        self._lengths = np.zeros(0, dtype=np.int64)
        self._checkpoints = np.zeros((0, 2), dtype=np.int64)  # -1 where a sequence has fewer checkpoints
        self._to_latest = np.zeros(0, dtype=np.int64)  # lcp(latest sequence, each sequence)
        self._measured: tuple[SharedSequence, np.ndarray] | None = None  # the last prompt and its lcps

    def _through(self, x: SharedSequence, with_middle: int, middle_to: np.ndarray) -> np.ndarray:
        """lcp(x, S) for every cached S, from lcp(x, M) and lcp(M, S) for some sequence M."""
        common = np.minimum(middle_to, with_middle)
        for j in np.flatnonzero(middle_to == with_middle).tolist():
            if with_middle < x.length and with_middle < self._lengths[j]:
                common[j] = shared_common_prefix(x, self.sequences[j], known=with_middle)
        return common

    def _common(self, x: SharedSequence) -> np.ndarray:
        if not self.sequences:
            return np.zeros(0, dtype=np.int64)
        return self._through(x, shared_common_prefix(x, self.sequences[-1]), self._to_latest)

    def reuse(self, prompt: SharedSequence | Sequence[int]) -> Reuse:
        """What `prompt` reuses from the sequences added so far."""
        prompt = _shared_ids(prompt)
        common = self._common(prompt)
        self._measured = (prompt, common)
        if not self.sequences:
            return Reuse(0, 0, 0, -1)
        token = int(common.max())
        matched = len(common) - 1 - int(np.argmax(common[::-1]))  # ties go to the latest sequence
        usable = np.where(self._checkpoints <= common[:, None], self._checkpoints, 0)
        return Reuse(token, block_reusable(token, self.block_size), max(0, int(usable.max())), matched)

    def add(self, sequence: SharedSequence | Sequence[int], checkpoints: tuple[int, ...] = ()) -> None:
        """Cache `sequence` (a request's prompt plus generation) with the hybrid checkpoints taken in it."""
        sequence = _shared_ids(sequence)
        if self._measured is not None:
            prompt, common = self._measured
            to_latest = self._through(sequence, shared_common_prefix(sequence, prompt), common)
        else:
            to_latest = self._common(sequence)
        self._measured = None
        row = np.full((1, 2), -1, dtype=np.int64)
        row[0, :len(checkpoints)] = checkpoints
        self.sequences.append(sequence)
        self._lengths = np.append(self._lengths, sequence.length)
        self._checkpoints = np.concatenate((self._checkpoints, row))
        self._to_latest = np.append(to_latest, sequence.length)


def _shared_ids(ids: SharedSequence | Sequence[int]) -> SharedSequence:
    return ids if isinstance(ids, SharedSequence) else SharedSequence(None, 0, np.asarray(ids, dtype=np.int32))


def checkpoints_after(prompt_len: int, sequence_len: int, policy: str) -> tuple[int, ...]:
    """Where a hybrid model keeps its state after one request, under a checkpoint policy."""
    if policy == "prompt-and-generation-end":
        return (prompt_len, sequence_len)
    if policy == "generation-end":
        return (sequence_len,)
    if policy == "none":
        return ()
    raise ExplorerError(f"unknown checkpoint policy {policy!r}; known: {', '.join(CHECKPOINT_POLICIES)}")


@dataclass(frozen=True)
class Counts:
    prompt_tokens: int
    reusable_tokens: int
    prefill_tokens: int
    decode_tokens: int | None  # None for a request whose reply is not scripted

    def to_json(self) -> dict[str, int | None]:
        return dict(self.__dict__)


class RequestViews:
    """One request's rendered prompt and sequence (text with per-character provenance) and their tokens (ids with
    character offsets), each built the first time a view reads it, from the session's shared text and ids.

    A session keeps what is new in each request (`engine.prefix.SharedSequence`), not a copy of the whole history
    per request: a 1,000-call session's prompts hold 10^8 characters in all. The provenance comes from rendering the
    request again (the renderer checks it gives the same text); offsets from tokenizing the text again.
    """

    def __init__(self, prompt: Callable[[], Rendered], prompt_tokens: Callable[[], Tokens],
                 sequence: Callable[[], Rendered], sequence_tokens: Callable[[], Tokens]) -> None:
        self._build = {"prompt_render": prompt, "prompt_tokenized": prompt_tokens, "sequence_render": sequence,
                       "sequence_tokenized": sequence_tokens}
        self._built: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = self._build[name]()
        return self._built[name]

    @property
    def prompt_render(self) -> Rendered:
        return self._get("prompt_render")

    @property
    def prompt_tokenized(self) -> Tokens:
        return self._get("prompt_tokenized")

    @property
    def sequence_render(self) -> Rendered:
        return self._get("sequence_render")

    @property
    def sequence_tokenized(self) -> Tokens:
        return self._get("sequence_tokenized")


@dataclass(frozen=True)
class RequestRow:
    index: int  # 1-based request number
    trigger: str  # "user", "tool", "next user"
    prompt_tokens: int
    reusable_tokens: int  # token-level common prefix with the cached sequences of the earlier requests
    prefill_tokens: int
    decode_tokens: int | None  # None for the last request, whose reply is not scripted
    block_reusable_tokens: int
    hybrid_reusable_tokens: int
    sequence_tokens: int  # prompt + generation
    previous_sequence_tokens: int = 0  # the whole sequence of request index-1 (0 for the first request)
    matched_request: int = 0  # the request whose sequence the reuse comes from (0: none)
    # The rendered prompt / sequence and their tokens, built when a view first reads them (`RequestViews`).
    views: RequestViews | None = field(default=None, repr=False, compare=False)
    # Under an engine: what its parsers changed in this request's reply, and its request side in this prompt.
    parse_edits: tuple[Edit, ...] = field(default=(), repr=False, compare=False)
    request_edits: tuple[Edit, ...] = field(default=(), repr=False, compare=False)

    @property
    def prompt_render(self) -> Rendered | None:
        return self.views.prompt_render if self.views else None

    @property
    def prompt_tokenized(self) -> Tokens | None:
        return self.views.prompt_tokenized if self.views else None

    @property
    def sequence_render(self) -> Rendered | None:
        return self.views.sequence_render if self.views else None

    @property
    def sequence_tokenized(self) -> Tokens | None:
        return self.views.sequence_tokenized if self.views else None

    @property
    def block_prefill_tokens(self) -> int:
        return self.prompt_tokens - self.block_reusable_tokens

    @property
    def hybrid_prefill_tokens(self) -> int:
        return self.prompt_tokens - self.hybrid_reusable_tokens

    @property
    def breaks(self) -> bool:
        """The reuse is short of the whole previous sequence: something before its end was rewritten."""
        return self.index > 1 and self.reusable_tokens < self.previous_sequence_tokens

    def counts(self, accounting: str = "token") -> Counts:
        reusable = {"token": self.reusable_tokens, "block": self.block_reusable_tokens,
                    "hybrid": self.hybrid_reusable_tokens}.get(accounting)
        if reusable is None:
            raise ExplorerError(f"unknown accounting {accounting!r}; known: {', '.join(ACCOUNTINGS)}")
        return Counts(self.prompt_tokens, reusable, self.prompt_tokens - reusable, self.decode_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "trigger": self.trigger, "prompt_tokens": self.prompt_tokens,
            "reusable_tokens": self.reusable_tokens, "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens, "block_reusable_tokens": self.block_reusable_tokens,
            "hybrid_reusable_tokens": self.hybrid_reusable_tokens, "sequence_tokens": self.sequence_tokens,
            "block_prefill_tokens": self.block_prefill_tokens, "hybrid_prefill_tokens": self.hybrid_prefill_tokens,
            "previous_sequence_tokens": self.previous_sequence_tokens, "matched_request": self.matched_request,
            "breaks": self.breaks,
        }


@dataclass(frozen=True)
class StepRewrite:
    """From request `from_request` on, the client sends `steps[step]` with `content` (e.g. a tool result summarised)."""

    from_request: int
    step: int
    content: str


@dataclass(frozen=True)
class ToolsChange:
    """From request `from_request` on, the client sends this tool list (a tool added, the list reordered)."""

    from_request: int
    tools: tuple[dict, ...]


@dataclass(frozen=True)
class SessionReport:
    model: str
    script: str
    kwargs: dict[str, Any]
    block_size: int
    checkpoint_policy: str
    rows: tuple[RequestRow, ...]
    history: str = "template"
    rewrites: tuple[StepRewrite | ToolsChange, ...] = ()
    engine: str | None = None  # "raw", "vllm", "sglang"; None: the template alone
    engine_version: str = ""

    @property
    def total_prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.rows)

    @property
    def total_prefill_tokens(self) -> int:
        return sum(r.prefill_tokens for r in self.rows)

    @property
    def total_block_prefill_tokens(self) -> int:
        return sum(r.block_prefill_tokens for r in self.rows)

    @property
    def total_hybrid_prefill_tokens(self) -> int:
        return sum(r.hybrid_prefill_tokens for r in self.rows)

    @property
    def total_decode_tokens(self) -> int:
        return sum(r.decode_tokens or 0 for r in self.rows)

    def totals(self, accounting: str = "token") -> Counts:
        counts = [r.counts(accounting) for r in self.rows]
        return Counts(sum(c.prompt_tokens for c in counts), sum(c.reusable_tokens for c in counts),
                      sum(c.prefill_tokens for c in counts), self.total_decode_tokens)

    def to_json(self) -> dict[str, Any]:
        requests = [r.to_json() for r in self.rows]
        if self.engine is not None:
            for row, data in zip(self.rows, requests):
                data["parse_edits"] = [_edit_json(e) for e in row.parse_edits]
                data["request_edits"] = [_edit_json(e) for e in row.request_edits]
        return {
            "model": self.model, "script": self.script, "kwargs": self.kwargs, "block_size": self.block_size,
            "checkpoint_policy": self.checkpoint_policy, "history": self.history,
            "engine": self.engine, "engine_version": self.engine_version,
            "requests": requests,
            "totals": {"prompt_tokens": self.total_prompt_tokens, "prefill_tokens": self.total_prefill_tokens,
                       "block_prefill_tokens": self.total_block_prefill_tokens,
                       "hybrid_prefill_tokens": self.total_hybrid_prefill_tokens,
                       "decode_tokens": self.total_decode_tokens},
            "accounting": {a: self.totals(a).to_json() for a in ACCOUNTINGS},
        }


def _edit_json(edit: Edit) -> dict[str, Any]:
    return {"step": edit.step, "before": edit.before, "after": edit.after, "description": edit.description,
            "location": {"origin": edit.location.origin, "path": edit.location.path, "line": edit.location.line,
                         "end_line": edit.location.end_line}}


# ---------------------------------------------------------------------------------------------------------------
# Rendering a session


RenderFn = Callable[[list[dict], list[dict] | None, bool], Rendered]


def _session_renderer(model: LoadedModel, script: SessionScript,
                      kwargs: dict[str, Any] | None) -> tuple[dict[str, Any], RenderFn]:
    """The template kwargs this script runs with, and a function rendering messages with them.

    It renders past the model's render cache: every request of a session is a new one, and the cache would keep
    each whole prompt alive (a 1,000-call session's prompts add up to 10^8 characters).
    """
    if model.tokenizer is None:
        raise ExplorerError(model.tokenizer_unavailable or f"model {model.id} has no tokenizer")
    renderer = getattr(model.renderer, "inner", model.renderer)
    template_kwargs = {**model.spec.default_kwargs(), **script.kwargs, **(kwargs or {})}

    def render(messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> Rendered:
        return renderer.render(messages, tools, add_generation_prompt=generation_prompt, kwargs=template_kwargs)

    return template_kwargs, render


def _rendered_view(chars: SharedSequence, again: Callable[[], Rendered], model: LoadedModel, source_path: str,
                   origin: str) -> Callable[[], Rendered]:
    """A request's `Rendered`, built when read: the text the session tokenized, the provenance of rendering the
    same request again (read only by a view)."""
    def build() -> Rendered:
        text = chars.materialize()

        def provenance() -> tuple[tuple[int, ...], tuple[int, ...]]:
            rendered = again()
            if rendered.text != text:
                raise RenderError(f"{source_path} for model {model.id} rendered a different text when run again to "
                                  "record which message and line produced each character (does it read the clock?)",
                                  model=model.id, path=source_path)
            return rendered.message_index, rendered.source_line

        return Rendered(text=text, source_path=source_path, origin=origin, provenance=provenance)

    return build


def _retokenized(tokenizer: Tokenizer, chars: SharedSequence) -> Callable[[], Tokens]:
    return lambda: tokenizer.encode(chars.materialize())


def _template_views(model: LoadedModel, render: RenderFn, messages: list[dict], tools: list[dict] | None,
                    prompt: Rendered, prompt_state: TokenizedText, reply: dict | None, sequence: Rendered,
                    sequence_state: TokenizedText) -> RequestViews:
    tokenizer = model.tokenizer
    assert tokenizer is not None  # _session_renderer refuses a model without one
    prompt_view = _rendered_view(prompt_state.chars, lambda: render(messages, tools, True), model,
                                 prompt.source_path, prompt.origin)
    prompt_tokens = _retokenized(tokenizer, prompt_state.chars)
    if reply is None:
        return RequestViews(prompt_view, prompt_tokens, prompt_view, prompt_tokens)
    return RequestViews(prompt_view, prompt_tokens,
                        _rendered_view(sequence_state.chars, lambda: render(messages + [reply], tools, False), model,
                                       sequence.source_path, sequence.origin),
                        _retokenized(tokenizer, sequence_state.chars))


def _concat(head: Rendered | None, tail: Rendered, origin: str) -> Rendered:
    if head is None:
        return Rendered(tail.text, tail.message_index, tail.source_line, tail.source_path, origin)
    return Rendered(head.text + tail.text, head.message_index + tail.message_index,
                    head.source_line + tail.source_line, tail.source_path, origin)


def _from_message(rendered: Rendered, first: int, model: LoadedModel) -> Rendered:
    """The part of a rendering from the first character that message `first` (or a later one) produced."""
    start = next((i for i, m in enumerate(rendered.message_index) if m >= first), None)
    if start is None:
        raise ExplorerError(f"model {model.id}: {rendered.source_path} gives no per-message provenance for "
                            f"message {first}, so the history cannot be kept append-only")
    return Rendered(rendered.text[start:], rendered.message_index[start:], rendered.source_line[start:],
                    rendered.source_path, rendered.origin)


def _generation_prompt(with_prompt: Rendered, without: Rendered, model: LoadedModel) -> Rendered:
    if not with_prompt.text.startswith(without.text):
        raise ExplorerError(f"model {model.id}: {with_prompt.source_path} renders the history differently with a "
                            "generation prompt, so the history cannot be kept append-only")
    n = len(without.text)
    return Rendered(with_prompt.text[n:], with_prompt.message_index[n:], with_prompt.source_line[n:],
                    with_prompt.source_path, with_prompt.origin)


def _check_rewrites(script: SessionScript, rewrites: Sequence[StepRewrite | ToolsChange]) -> None:
    requests = len(script.request_steps)
    for rewrite in rewrites:
        if not 1 <= rewrite.from_request <= requests:
            raise ExplorerError(f"session script {script.id}: a rewrite from request {rewrite.from_request}, but the "
                                f"script makes requests 1..{requests}")
        if isinstance(rewrite, StepRewrite) and not 0 <= rewrite.step < len(script.steps):
            raise ExplorerError(f"session script {script.id}: a rewrite of step {rewrite.step}, but the script has "
                                f"steps 0..{len(script.steps) - 1}")


def _request_input(script: SessionScript, request: int, last_step: int,
                   rewrites: Sequence[StepRewrite | ToolsChange]) -> tuple[list[dict], list[dict] | None]:
    """The messages (system first, through `last_step`) and tools the client sends for request `request`."""
    steps = list(script.steps[:last_step + 1])
    tools = script.tools
    for rewrite in rewrites:
        if rewrite.from_request > request:
            continue
        if isinstance(rewrite, StepRewrite) and rewrite.step <= last_step:
            steps[rewrite.step] = {**steps[rewrite.step], "content": rewrite.content}
        elif isinstance(rewrite, ToolsChange):
            tools = list(rewrite.tools)
    system = [{"role": "system", "content": script.system}] if script.system else []
    return system + steps, tools


def _decode_tokens(prompt: Rendered, prompt_tokens, sequence: Rendered, sequence_tokens, reply_index: int) -> int:
    """The completion's tokens: what the sequence holds after the prompt. When the template re-renders the history
    once the reply is added (GPT-OSS drops earlier analysis turns before a final answer), the sequence no longer
    starts with the prompt, and the completion is the reply's own span after the generation prompt the prompt
    ended with, not the difference of the two lengths (which went negative: request 3 of the handbook, -74)."""
    if sequence.text.startswith(prompt.text):
        return len(sequence_tokens.ids) - len(prompt_tokens.ids)
    from engine.provenance import spans

    start = next((span.start for span in spans(sequence) if span.message_index == reply_index), len(sequence.text))
    # The reply's span begins with the generation prompt (`<|start|>assistant`), which was prefilled, not decoded.
    generation = next((n for n in range(min(len(prompt.text), len(sequence.text) - start), 0, -1)
                       if sequence.text.startswith(prompt.text[-n:], start)), 0)
    completion_start = start + generation
    return sum(1 for token_start, _ in sequence_tokens.offsets if token_start >= completion_start)


def simulate_session(
    model: LoadedModel,
    script: SessionScript,
    *,
    kwargs: dict[str, Any] | None = None,
    block_size: int = 16,
    checkpoint_policy: str = "prompt-and-generation-end",
    history: str = "template",
    rewrites: Sequence[StepRewrite | ToolsChange] = (),
    engine: EngineSpec | str | None = None,
) -> SessionReport:
    """The session request by request; `engine` (raw, vllm, sglang[@version]) sends each reply through the
    engine as production does (see the module docstring), None renders the scripted replies with the template."""
    if block_size < 1:
        raise ExplorerError(f"block size must be at least 1, got {block_size}")
    checkpoints_after(0, 0, checkpoint_policy)  # an unknown policy fails before any rendering
    if history not in HISTORY_MODES:
        raise ExplorerError(f"unknown history mode {history!r}; known: {', '.join(HISTORY_MODES)}")
    if history == "append" and rewrites:
        raise ExplorerError("history 'append' keeps every earlier request's text, so it cannot take rewrites")
    _check_rewrites(script, rewrites)
    if engine is not None and history != "template":
        raise ExplorerError(f"engine {str(engine)!r} re-renders every request from the parsed messages, so it cannot "
                            f"keep the history {history!r}; use history 'template' with an engine")
    spec = _session_engine(engine) if engine is not None else None
    if spec is not None and spec.is_serving_engine:
        model = _as_served(model, spec)
    template_kwargs, render = _session_renderer(model, script, kwargs)
    engine_side = _EngineSide(model, script, spec, template_kwargs, render) if spec is not None else None
    tokenizer = model.tokenizer
    assert tokenizer is not None  # _session_renderer refuses a model without one

    index = ReuseIndex(block_size)
    rows: list[RequestRow] = []
    last: TokenizedText | None = None  # the text tokenized last, which the next one usually extends
    kept: Rendered | None = None  # append mode: the previous request's whole sequence as first rendered
    kept_messages = 0
    for n, step in enumerate(script.request_steps, start=1):
        seen_assistant = any(m["role"] == "assistant" for m in script.steps[:step])
        messages, tools = _request_input(script, n, step, rewrites)
        reply = next((m for m in script.steps[step + 1:] if m["role"] == "assistant"), None)
        edits: dict[str, tuple[Edit, ...]] = {}
        if engine_side is not None:
            prompt, to_render, written, edits = engine_side.request(messages, tools, n, step)
            prompt_state = last = tokenize_extending(tokenizer, prompt.text_source, last,
                                                     known_agreement(prompt, last))
            prompt_ids = sequence_ids = prompt_state.ids
            if written is not None:
                sequence_ids = SharedSequence(prompt_ids, prompt_ids.length, np.asarray(written.ids, dtype=np.int32))
            views = engine_side.views(prompt, prompt_state, to_render, engine_side.rendered_tools, len(messages),
                                      written)
        elif history == "template":
            prompt = sequence = render(messages, tools, True)
            # Each text as the render made it (its pieces, joined only if a view reads it), compared and tokenized
            # from where it is known to agree with the one before.
            prompt_state = sequence_state = last = tokenize_extending(tokenizer, prompt.text_source, last,
                                                                      known_agreement(prompt, last))
            if reply:
                sequence = render(messages + [reply], tools, False)
                sequence_state = last = tokenize_extending(tokenizer, sequence.text_source, prompt_state,
                                                           known_agreement(sequence, prompt_state))
            prompt_ids, sequence_ids = prompt_state.ids, sequence_state.ids
            views = _template_views(model, render, messages, tools, prompt, prompt_state, reply, sequence,
                                    sequence_state)
        else:
            origin = f"append-only history over {model.renderer.origin}"
            without = render(messages, tools, False)
            base = _concat(kept, _from_message(without, kept_messages, model) if kept else without, origin)
            prompt = sequence = _concat(base, _generation_prompt(render(messages, tools, True), without, model),
                                        origin)
            prompt_state = sequence_state = last = tokenize_extending(tokenizer, prompt.text, last)
            if reply:
                with_reply = render(messages + [reply], tools, False)
                sequence = _concat(base, _from_message(with_reply, len(messages), model), origin)
                sequence_state = last = tokenize_extending(tokenizer, sequence.text, prompt_state)
            kept, kept_messages = sequence, len(messages) + (1 if reply else 0)
            prompt_ids, sequence_ids = prompt_state.ids, sequence_state.ids
            views = RequestViews((lambda p=prompt: p), _retokenized(tokenizer, prompt_state.chars),
                                 (lambda q=sequence: q), _retokenized(tokenizer, sequence_state.chars))
        reuse = index.reuse(prompt_ids)
        decode = None
        # The sequence's text was tokenized from the prompt's: it keeps all of it exactly when it starts with it.
        if reply and (engine_side is not None or sequence_state.chars.keep == len(prompt.text_source)):
            decode = sequence_ids.length - prompt_ids.length
        elif reply:  # the template re-rendered the history once the reply was added (_decode_tokens)
            decode = _decode_tokens(views.prompt_render, views.prompt_tokenized, views.sequence_render,
                                    views.sequence_tokenized, len(messages))
        trigger = "tool" if script.steps[step]["role"] == "tool" else ("next user" if seen_assistant else "user")
        rows.append(RequestRow(
            index=n,
            trigger=trigger,
            prompt_tokens=prompt_ids.length,
            reusable_tokens=reuse.token,
            prefill_tokens=prompt_ids.length - reuse.token,
            decode_tokens=decode,
            block_reusable_tokens=reuse.block,
            hybrid_reusable_tokens=reuse.hybrid,
            sequence_tokens=sequence_ids.length,
            previous_sequence_tokens=index.sequences[-1].length if index.sequences else 0,
            matched_request=reuse.matched + 1,
            views=views,
            **edits,
        ))
        index.add(sequence_ids, checkpoints_after(prompt_ids.length, sequence_ids.length, checkpoint_policy))
    return SessionReport(model.id, script.id, template_kwargs, block_size, checkpoint_policy, tuple(rows),
                         history, tuple(rewrites), engine_side.name if engine_side else None,
                         engine_side.version if engine_side else "")


# ---------------------------------------------------------------------------------------------------------------
# A session through an engine: replies written as model output, parsed, sent back as the client does


def _assistant_turn(script: SessionScript, index: int) -> AssistantTurn:
    """The model's output for scripted reply `steps[index]`: its reasoning, content and tool calls."""
    reply = script.steps[index]
    where = f"session script {script.source or script.id}: step {index}"
    reasoning = reply.get("reasoning_content", reply.get("reasoning"))
    content = reply.get("content") or ""
    if not isinstance(content, str) or not isinstance(reasoning, str | None):
        raise ExplorerError(f"{where}: content and reasoning_content must be strings to be written as model output")
    return AssistantTurn(reasoning, content, tool_call_specs(reply.get("tool_calls"), where))


def _session_engine(engine: EngineSpec | str) -> EngineSpec:
    """The engine a session runs through, parsed once: raw or a vLLM / SGLang release (not bridge or renderers)."""
    try:
        spec = EngineSpec.of(engine)
    except ValueError:
        spec = None
    if spec is None or not (spec.kind == "raw" or spec.is_serving_engine):
        raise _unknown_session_engine(str(engine))
    return spec


def _unknown_session_engine(engine: str) -> ExplorerError:
    known = ", ".join(["raw", "vllm", "sglang", *list_engines()])
    hint = " (bridge is history 'append')" if engine == "bridge" else ""
    return ExplorerError(f"unknown engine {engine!r} for a session{hint}; known: {known}")


def _as_served(model: LoadedModel, engine: EngineSpec) -> LoadedModel:
    """The model as `engine`'s release renders it (engine.serving.rendering); an unknown engine is _EngineSide's
    to report."""
    from engine.serving.rendering import ServingUnavailable, served_model

    try:
        return served_model(model, get_engine(engine))
    except ValueError:
        return model
    except ServingUnavailable as err:
        raise ExplorerError(str(err)) from None


class _EngineSide:
    """Builds each request as the client sends it after the engine parsed the earlier replies, and writes the
    scripted reply as the model's completion: the sequence the cache then holds is prompt + completion."""

    def __init__(self, model: LoadedModel, script: SessionScript, engine: EngineSpec,
                 template_kwargs: dict[str, Any], render: RenderFn) -> None:
        self.model, self.script, self.kwargs, self.render = model, script, template_kwargs, render
        if engine.kind == "raw":
            self.emulation, self.name, self.version = None, "raw", ""
        else:
            try:
                serving = serving_engine(engine, model.spec.engine_parsers)
            except ValueError:
                raise _unknown_session_engine(str(engine)) from None
            self.emulation, self.parsers = serving.engine, serving.parsers
            self.name, self.version = self.emulation.name, self.emulation.version
        if self.emulation is None:
            self.parsers = {}
        self.fmt = get_format(model.spec.family)
        self.stop = model.spec.stop_tokens[0] if model.spec.stop_tokens else ""
        self.sent: dict[int, dict] = {}  # scripted reply's step -> the message the client sends back instead
        self.rendered_tools: list[dict] | None = None  # the last request's tools as the template was given them
        self.call_ids: dict[int, list[str]] = {}  # scripted reply's step -> the ids of its parsed tool calls
        self.session_ids = SessionCallIds()
        self.calls_so_far = 0

    @property
    def origin(self) -> str:  # the engine can change: a pinned one hands an unemulated pair to its real code
        return self.emulation.origin if self.emulation is not None else "the raw split"

    def _client_messages(self, messages: list[dict]) -> list[dict]:
        """The script's messages (system first) with each generated reply replaced by its parsed message, and the
        tool results after it answering the call ids the engine returned, in order, as a client does."""
        offset = 1 if self.script.system else 0
        out: list[dict] = []
        ids: list[str] = []
        for position, message in enumerate(messages):
            step = position - offset
            if step in self.sent:
                out.append(self.sent[step])
                ids = list(self.call_ids[step])
                continue
            if message.get("role") == "assistant":
                ids = []
            elif message.get("role") == "tool" and (ids or "tool_call_id" not in message):
                message = {**message, "tool_call_id": ids.pop(0) if ids else "call_missing"}
            out.append(message)
        return out

    def request(self, messages: list[dict], tools: list[dict] | None, number: int,
                step: int) -> tuple[Rendered, list[dict], Tokens | None, dict[str, tuple[Edit, ...]]]:
        """Request `number`, started by `steps[step]`: its prompt, the messages rendered for it, the tokens of the
        completion the model writes when the next step is a scripted reply (else None), and the engine's edits."""
        sent = self._client_messages(messages)
        request_edits: tuple[Edit, ...] = ()
        rendered_tools = tools
        if self.emulation is None:
            to_render = raw_request(sent, self.fmt.arguments_in_history)
        else:
            from engine.simulate import engine_request

            prep = engine_request(self.emulation, self.model, sent, tools, self.kwargs, self.parsers)
            if prep.error:
                raise ExplorerError(f"model {self.model.id}: {self.origin} rejects request {number} of session "
                                    f"{self.script.id}: {prep.error}")
            to_render, request_edits = prep.messages, prep.edits
            if prep.tools is not None:  # as the engine hands them to the template (SGLang: its pydantic dump)
                rendered_tools = prep.tools
        self.rendered_tools = rendered_tools
        try:
            prompt = self.render(to_render, rendered_tools, True)
        except RenderError as err:
            # E.g. the engine dropped a tool call the template needs before the tool result that answers it.
            raise ExplorerError(f"request {number} of session {self.script.id}, as sent after {self.origin} parsed "
                                f"the earlier replies, cannot be rendered: {err}") from None
        reply_step = step + 1
        if reply_step >= len(self.script.steps) or self.script.steps[reply_step]["role"] != "assistant":
            return prompt, to_render, None, {"request_edits": request_edits}
        turn = turn_as_written(self.model, _assistant_turn(self.script, reply_step), prompt.text)
        completion = self.fmt.write(turn, self.stop)
        parsed = self._parse(completion, tools, reply_step, reasoning_forced(self.model, prompt.text))
        ids = client_call_ids(parsed, [c.call_id for c in turn.tool_calls], self.fmt, self.session_ids,
                              self.calls_so_far)
        self.calls_so_far += len(parsed.tool_calls)
        self.sent[reply_step], self.call_ids[reply_step] = client_message(parsed, ids), ids
        # The cache holds the prompt's ids followed by the generated ids: the completion tokenized on its own.
        written = self.model.tokenizer.encode(completion.text)
        return prompt, to_render, written, {"parse_edits": parsed.edits, "request_edits": request_edits}

    def views(self, prompt: Rendered, prompt_state: TokenizedText, to_render: list[dict], tools: list[dict] | None,
              message_count: int, written: Tokens | None) -> RequestViews:
        """The request's views: the prompt as rendered, and the sequence as prompt + written completion (its
        characters attributed to the reply's message and no template line)."""
        tokenizer = self.model.tokenizer
        prompt_view = _rendered_view(prompt_state.chars, lambda: self.render(to_render, tools, True), self.model,
                                     prompt.source_path, prompt.origin)
        prompt_tokens = _retokenized(tokenizer, prompt_state.chars)
        if written is None:
            return RequestViews(prompt_view, prompt_tokens, prompt_view, prompt_tokens)
        origin = f"{prompt.origin} + output written by engine/formats ({self.model.spec.family})"

        def sequence() -> Rendered:
            head, text = views.prompt_render, written.text
            return Rendered(head.text + text, source_path=head.source_path, origin=origin,
                            provenance=lambda: (head.message_index + (message_count,) * len(text),
                                                head.source_line + (0,) * len(text)))

        def sequence_tokens() -> Tokens:
            head, n = views.prompt_tokenized, len(views.prompt_render.text)
            return Tokens(head.ids + written.ids, head.offsets + tuple((a + n, b + n) for a, b in written.offsets),
                          head.text + written.text)

        views = RequestViews(prompt_view, prompt_tokens, sequence, sequence_tokens)
        return views

    def _parse(self, completion: Completion, tools: list[dict] | None, reply_step: int,
               force_reasoning: bool) -> ParseResult:
        if self.emulation is None:
            return self.fmt.raw_parse(completion.parser_text)
        tool_parser = self.parsers.get("tool_call_parser")
        try:
            text = self.emulation.output_text(completion.text, completion.stop_token, tool_parser)
            self.emulation, parsed = parse_served(self.emulation, text, dict(
                reasoning_parser=self.parsers.get("reasoning_parser"), tool_parser=tool_parser, tools=tools,
                chat_template_kwargs=self.kwargs, history_tool_calls=self.calls_so_far,
                tokenizer=self.model.tokenizer),
                {"force_reasoning": force_reasoning, "added_tokens": self.model.spec.added_tokens})
        except NotImplementedError as err:
            raise ExplorerError(f"model {self.model.id}: {self.origin} cannot parse its output yet ({err}), so "
                                f"session {self.script.id} cannot run through it") from None
        except ValueError as err:  # a parser name in the model's manifest that this engine version lacks
            raise ExplorerError(f"model {self.model.id}: {err}") from None
        if parsed.error:
            raise ExplorerError(f"model {self.model.id}: {self.origin} fails the reply of step {reply_step} of "
                                f"session {self.script.id}: {parsed.error}")
        return parsed


# ---------------------------------------------------------------------------------------------------------------
# The break view: where a request's reuse stops short of the previous sequence


@dataclass(frozen=True)
class BreakView:
    request: int  # the request whose prompt breaks
    compared_request: int  # the request whose whole sequence it is compared with
    previous: Rendered  # that sequence, with per-character message index and template line
    previous_tokens: Tokens
    next: Rendered  # the request's prompt
    next_tokens: Tokens
    token_position: int  # first differing token (the reusable tokens)
    char_position: int  # first differing character of the two texts (== len(previous text) if only ids differ)
    token_char_start: int  # where the first differing token of the next prompt starts in its text
    previous_token_char_start: int  # where the token at that position starts in the previous text
    previous_location: Location | None  # the template line that emitted previous.text[char_position]
    next_location: Location | None  # the template line that emitted next.text[char_position]
    previous_message_index: int  # message of that character (-1: template scaffolding, or past the end)
    next_message_index: int

    @property
    def previous_text(self) -> str:
        return self.previous.text

    @property
    def previous_ids(self) -> tuple[int, ...]:
        return self.previous_tokens.ids

    @property
    def next_text(self) -> str:
        return self.next.text

    @property
    def next_ids(self) -> tuple[int, ...]:
        return self.next_tokens.ids

    @property
    def token_only(self) -> bool:
        """The texts agree through the previous sequence; only re-tokenization differs."""
        return self.char_position >= len(self.previous.text)

    def to_json(self) -> dict[str, Any]:
        def loc(location: Location | None) -> dict | None:
            return None if location is None else {"origin": location.origin, "path": location.path,
                                                  "line": location.line, "text": location.text}

        at = self.char_position
        return {
            "request": self.request, "compared_request": self.compared_request,
            "token_position": self.token_position, "char_position": at, "token_char_start": self.token_char_start,
            "previous_token_char_start": self.previous_token_char_start, "token_only": self.token_only,
            "previous_snippet": self.previous.text[at:at + 40], "next_snippet": self.next.text[at:at + 40],
            "previous_location": loc(self.previous_location), "next_location": loc(self.next_location),
            "previous_message_index": self.previous_message_index, "next_message_index": self.next_message_index,
        }


def _location_at(rendered: Rendered, at: int, lines: list[str]) -> tuple[Location | None, int]:
    if not 0 <= at < len(rendered.text):
        return None, -1
    line = rendered.source_line[at]
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return Location(rendered.origin, rendered.source_path, line, text=text), rendered.message_index[at]


def break_view(model: LoadedModel, report: SessionReport, index: int) -> BreakView | None:
    """The break view of request `index` (1-based), or None when it reuses the whole previous sequence."""
    if not 1 <= index <= len(report.rows):
        raise ExplorerError(f"session {report.script} has requests 1..{len(report.rows)}, not {index}")
    row = report.rows[index - 1]
    if not row.breaks:
        return None
    # Compare with the sequence the reuse comes from: the previous one unless an earlier one matched further.
    compared = report.rows[(row.matched_request or index - 1) - 1]
    previous, previous_tokens = compared.sequence_render, compared.sequence_tokenized
    nxt, next_tokens = row.prompt_render, row.prompt_tokenized
    if previous is None or previous_tokens is None or nxt is None or next_tokens is None:
        raise ExplorerError(f"session {report.script}: request {index} carries no rendered text to compare")
    token_at = common_prefix(previous_tokens.ids, next_tokens.ids)
    char_at = common_prefix(previous.text, nxt.text)
    token_char = next_tokens.offsets[token_at][0] if token_at < len(next_tokens.offsets) else len(nxt.text)
    previous_char = (previous_tokens.offsets[token_at][0] if token_at < len(previous_tokens.offsets)
                     else len(previous.text))
    if char_at >= len(previous.text):
        # Same text, different ids: the break is where the differing token starts.
        char_at = token_char
    lines = model.renderer.source_lines()
    previous_location, previous_message = _location_at(previous, char_at, lines)
    next_location, next_message = _location_at(nxt, char_at, lines)
    return BreakView(index, compared.index, previous, previous_tokens, nxt, next_tokens, token_at, char_at,
                     token_char, previous_char, previous_location, next_location, previous_message, next_message)


# ---------------------------------------------------------------------------------------------------------------
# Two unrelated sessions


def first_request_prompt(model: LoadedModel, script: SessionScript, system: str, question: str,
                         kwargs: dict[str, Any] | None = None) -> list[int]:
    _, render = _session_renderer(model, script, kwargs)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return list(token_ids(model.tokenizer, render(messages, script.tools, True).text))


def _require_questions(script: SessionScript) -> None:
    if len(script.unrelated_questions) < 2:
        raise ExplorerError(f"session script {script.id} needs two unrelated_questions for the cross-session "
                            f"figures, it has {len(script.unrelated_questions)}")


def shared_across_sessions(model: LoadedModel, script: SessionScript, kwargs: dict[str, Any] | None = None) -> int:
    """Tokens two unrelated sessions' first requests share (tools + system prompt)."""
    _require_questions(script)
    a, b = (first_request_prompt(model, script, script.system, q, kwargs) for q in script.unrelated_questions[:2])
    return common_prefix(a, b)


def _timestamped_prompts(model: LoadedModel, script: SessionScript, where: str,
                         kwargs: dict[str, Any] | None) -> list[list[int]]:
    if where not in ("start", "end"):
        raise ExplorerError(f"timestamp position must be start or end, got {where!r}")
    _require_questions(script)
    if not script.timestamp_template or len(script.timestamp_seconds) < 2:
        raise ExplorerError(f"session script {script.id} needs a timestamp template and two seconds for the "
                            "timestamp figures")
    prompts = []
    for second, question in zip(script.timestamp_seconds, script.unrelated_questions):
        try:
            stamp = script.timestamp_template.format(second=second)
        except (KeyError, IndexError, ValueError) as err:
            raise ExplorerError(f"session script {script.id}: timestamp template {script.timestamp_template!r} "
                                f"must use only {{second}}: {err!r}") from err
        system = stamp + script.system if where == "start" else script.system + stamp
        prompts.append(first_request_prompt(model, script, system, question, kwargs))
    return prompts


def shared_with_timestamp(model: LoadedModel, script: SessionScript, where: str,
                          kwargs: dict[str, Any] | None = None) -> int:
    """Tokens two unrelated sessions share when the system prompt carries the current time at its `start`/`end`."""
    a, b = _timestamped_prompts(model, script, where, kwargs)
    return common_prefix(a, b)


# ---------------------------------------------------------------------------------------------------------------
# What-if experiments


@dataclass(frozen=True)
class WhatIfRequest:
    index: int
    prompt_before: int
    prompt_after: int
    reusable_before: int
    reusable_after: int
    block_reusable_before: int
    block_reusable_after: int
    hybrid_reusable_before: int
    hybrid_reusable_after: int

    @property
    def prefill_before(self) -> int:
        return self.prompt_before - self.reusable_before

    @property
    def prefill_after(self) -> int:
        return self.prompt_after - self.reusable_after

    def to_json(self) -> dict[str, int]:
        return {**self.__dict__, "prefill_before": self.prefill_before, "prefill_after": self.prefill_after}


@dataclass(frozen=True)
class WhatIfResult:
    name: str
    title: str  # the switch, as a page labels it
    description: str  # one line: what was switched and what it did, with the figures
    before_label: str
    after_label: str
    requests: tuple[WhatIfRequest, ...]  # for a cross-session experiment: the second session's first request
    block_size: int
    before: SessionReport | None = None  # the whole sessions, when the experiment is one session run twice
    after: SessionReport | None = None

    @property
    def engine(self) -> str:
        """The engine both sessions ran through ("vllm 0.33.0"); "" for the template alone or a first-request
        experiment (no reply has been parsed before a first request, so no engine changes it)."""
        if self.before is None or self.before.engine is None:
            return ""
        return f"{self.before.engine} {self.before.engine_version}".strip()

    @property
    def reusable_before(self) -> int:
        return sum(r.reusable_before for r in self.requests)

    @property
    def reusable_after(self) -> int:
        return sum(r.reusable_after for r in self.requests)

    @property
    def prefill_before(self) -> int:
        return sum(r.prefill_before for r in self.requests)

    @property
    def prefill_after(self) -> int:
        return sum(r.prefill_after for r in self.requests)

    @property
    def changed(self) -> tuple[WhatIfRequest, ...]:
        """The requests whose prefill the switch changes."""
        return tuple(r for r in self.requests if r.prefill_before != r.prefill_after)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "description": self.description, "engine": self.engine or None,
            "before_label": self.before_label, "after_label": self.after_label, "block_size": self.block_size,
            "requests": [r.to_json() for r in self.requests],
            "totals": {"reusable_before": self.reusable_before, "reusable_after": self.reusable_after,
                       "prefill_before": self.prefill_before, "prefill_after": self.prefill_after,
                       "block_reusable_before": sum(r.block_reusable_before for r in self.requests),
                       "block_reusable_after": sum(r.block_reusable_after for r in self.requests),
                       "hybrid_reusable_before": sum(r.hybrid_reusable_before for r in self.requests),
                       "hybrid_reusable_after": sum(r.hybrid_reusable_after for r in self.requests)},
        }


@dataclass(frozen=True)
class SessionSettings:
    """The settings every what-if runs the session with (the CLI's --kwargs, --block-size, --checkpoint-policy)."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    block_size: int = 16
    checkpoint_policy: str = "prompt-and-generation-end"
    engine: EngineSpec | str | None = None  # both sides of the comparison through this engine (raw, vllm, sglang@X)


@dataclass(frozen=True)
class WhatIf:
    name: str
    title: str
    summary: str  # what the switch does, before running it
    run: Callable[[LoadedModel, SessionScript, SessionSettings], WhatIfResult]


def _simulate(model: LoadedModel, script: SessionScript, settings: SessionSettings, **more: Any) -> SessionReport:
    return simulate_session(model, script, kwargs=settings.kwargs, block_size=settings.block_size,
                            checkpoint_policy=settings.checkpoint_policy, engine=settings.engine, **more)


def _compare_sessions(before: SessionReport, after: SessionReport) -> tuple[WhatIfRequest, ...]:
    return tuple(
        WhatIfRequest(b.index, b.prompt_tokens, a.prompt_tokens, b.reusable_tokens, a.reusable_tokens,
                      b.block_reusable_tokens, a.block_reusable_tokens, b.hybrid_reusable_tokens,
                      a.hybrid_reusable_tokens)
        for b, a in zip(before.rows, after.rows)
    )


def _changes_text(requests: Sequence[WhatIfRequest]) -> str:
    changed = [r for r in requests if r.prefill_before != r.prefill_after]
    if not changed:
        return "no request changes"
    return "; ".join(f"request {r.index} reuses {r.reusable_after} instead of {r.reusable_before}, prefills "
                     f"{r.prefill_after} instead of {r.prefill_before}" for r in changed)


def _session_result(what_if: WhatIf, before: SessionReport, after: SessionReport, before_label: str,
                    after_label: str) -> WhatIfResult:
    requests = _compare_sessions(before, after)
    description = (f"{what_if.title} ({after_label}): {_changes_text(requests)}; total prefill "
                   f"{before.total_prefill_tokens} -> {after.total_prefill_tokens}")
    return WhatIfResult(what_if.name, what_if.title, description, before_label, after_label, requests,
                        before.block_size, before, after)


def _fmt_kwargs(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in kwargs.items())


def history_preserving_kwargs(model: LoadedModel, script: SessionScript,
                              settings: SessionSettings | None = None) -> dict[str, Any] | None:
    """The template kwarg flip that makes every request reuse the whole previous sequence.

    Computed, not looked up: each boolean template kwarg of the model is flipped in turn. {} when no request breaks
    with the given kwargs; None when no single flip keeps the history (e.g. Qwen3.5-0.8B's template has no switch).
    """
    settings = settings or SessionSettings()
    if not any(r.breaks for r in _simulate(model, script, settings).rows):
        return {}
    effective = {**model.spec.default_kwargs(), **script.kwargs, **settings.kwargs}
    for kwarg in model.spec.template_kwargs:
        value = effective.get(kwarg.name)
        if not isinstance(value, bool):
            continue
        trial = dataclasses.replace(settings, kwargs={**settings.kwargs, kwarg.name: not value})
        if not any(r.breaks for r in _simulate(model, script, trial).rows):
            return {kwarg.name: not value}
    return None


def _history_kept(model: LoadedModel, script: SessionScript, settings: SessionSettings) -> WhatIfResult:
    what_if = WHAT_IFS["history-kept"]
    before = _simulate(model, script, settings)
    preserving = history_preserving_kwargs(model, script, settings)
    if preserving:
        after = _simulate(model, script, dataclasses.replace(settings, kwargs={**settings.kwargs, **preserving}))
        after_label = f"template kwargs {_fmt_kwargs(preserving)}"
    elif settings.engine is not None:
        raise ExplorerError(f"history kept through engine {settings.engine}: no single template kwarg keeps "
                            f"{model.id}'s history, and an append-only history is built from the template alone; "
                            "run this what-if without an engine")
    else:
        after = _simulate(model, script, settings, history="append")
        # Each prompt is then the previous request's whole sequence plus the new messages and generation prompt.
        after_label = ("append-only: no template kwarg keeps the history" if preserving is None else
                       "append-only: the template already keeps the history")
    before_label = f"template kwargs {_fmt_kwargs(before.kwargs)}" if before.kwargs else "the template's defaults"
    return _session_result(what_if, before, after, before_label, after_label)


def _request_of_step(script: SessionScript, step: int) -> int:
    """The request a step is first sent in (the request its own message, or the next user/tool message, starts)."""
    return next((n for n, s in enumerate(script.request_steps, start=1) if s >= step),
                len(script.request_steps) + 1)


def _setting(script: SessionScript, key: str, default: Any) -> Any:
    value = script.what_if.get(key, default)
    return default if value is None else value


def _int_setting(script: SessionScript, name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ExplorerError(f"session script {script.id}: what_if {name} must be an integer, got {value!r}")
    return value


def _summarised(model: LoadedModel, script: SessionScript, settings: SessionSettings) -> WhatIfResult:
    what_if = WHAT_IFS["tool-result-summarised"]
    config = _setting(script, "summary", {})
    if not isinstance(config, dict):
        raise ExplorerError(f"session script {script.id}: what_if summary must be an object, got {config!r:.60}")
    tool_steps = [i for i, m in enumerate(script.steps) if m["role"] == "tool"]
    requests = len(script.request_steps)
    # Default: the first tool result that is still followed by two requests, summarised from the second of them.
    default_step = next((i for i in tool_steps if _request_of_step(script, i) + 1 <= requests), None)
    step = config.get("step", default_step)
    if step is not None:
        step = _int_setting(script, "summary.step", step)
    if step is None or not 0 <= step < len(script.steps) or script.steps[step]["role"] != "tool":
        raise ExplorerError(f"session script {script.id}: no tool result to summarise (what_if summary.step "
                            f"{config.get('step')!r} is not a tool message followed by two requests)")
    from_request = _int_setting(script, "summary.from_request",
                                config.get("from_request", _request_of_step(script, step) + 1))
    if from_request <= _request_of_step(script, step) or from_request > requests:
        raise ExplorerError(f"session script {script.id}: the summary of step {step} must start at a request after "
                            f"{_request_of_step(script, step)} and at most {requests}, got {from_request}")
    original = str(script.steps[step].get("content", ""))
    content = config.get("content") or (original.strip().splitlines() or [""])[0][:80]
    before = _simulate(model, script, settings)
    after = _simulate(model, script, settings, rewrites=(StepRewrite(from_request, step, content),))
    after_label = f"from request {from_request}, step {step}'s tool result ({len(original)} chars) sent as " \
                  f"{content!r}"
    return _session_result(what_if, before, after, "every tool result sent in full", after_label)


def _tools_changed(model: LoadedModel, script: SessionScript, settings: SessionSettings, name: str) -> WhatIfResult:
    what_if = WHAT_IFS[name]
    tools = list(script.tools or [])
    from_request = _int_setting(script, "tools_change_request", _setting(script, "tools_change_request", 2))
    requests = len(script.request_steps)
    if not 1 <= from_request <= requests:
        raise ExplorerError(f"session script {script.id}: what_if tools_change_request must be in 1..{requests}, "
                            f"got {from_request}")
    if name == "tool-added":
        added = _setting(script, "added_tool", DEFAULT_ADDED_TOOL)
        if not isinstance(added, dict) or not isinstance(added.get("function"), dict):
            raise ExplorerError(f"session script {script.id}: what_if added_tool must be an OpenAI tool "
                                f"{{type, function}}, got {added!r:.60}")
        changed = tools + [added]
        after_label = f"from request {from_request}, tool {added['function'].get('name')!r} appended to the list"
    else:
        if len(tools) < 2:
            raise ExplorerError(f"session script {script.id} has {len(tools)} tool(s): nothing to reorder")
        changed = tools[::-1]
        names = [t.get("function", {}).get("name", "?") for t in changed]
        after_label = f"from request {from_request}, tools sent in reverse order ({', '.join(names)})"
    before = _simulate(model, script, settings)
    after = _simulate(model, script, settings, rewrites=(ToolsChange(from_request, tuple(changed)),))
    return _session_result(what_if, before, after, "the script's tool list, unchanged", after_label)


def _second_session_reuse(settings: SessionSettings, first: list[int], second: list[int]) -> Reuse:
    """What the second session's first request reuses from a cache holding the first session's first request."""
    cached = CachedSequence(tuple(first), checkpoints_after(len(first), len(first), settings.checkpoint_policy))
    return reuse_of(second, [cached], settings.block_size)


def _unrelated(model: LoadedModel, script: SessionScript, settings: SessionSettings) -> WhatIfResult:
    what_if = WHAT_IFS["unrelated-sessions"]
    _require_questions(script)
    a, b = (first_request_prompt(model, script, script.system, q, settings.kwargs)
            for q in script.unrelated_questions[:2])
    shared = _second_session_reuse(settings, a, b)
    # Before: nothing to share, as with a cold cache or another tenant's cache salt (vLLM cache_salt).
    request = WhatIfRequest(1, len(b), len(b), 0, shared.token, 0, shared.block, 0, shared.hybrid)
    description = (f"{what_if.title}: the second session's first request ({len(b)} tokens) reuses {shared.token} "
                   f"tokens of the first's, the tools and system prompt ({shared.block} in whole "
                   f"{settings.block_size}-token blocks); 0 with a separate cache or another tenant's cache salt")
    return WhatIfResult(what_if.name, what_if.title, description, "a separate cache (or another cache salt)",
                        "one shared prefix cache", (request,), settings.block_size)


def _timestamp(model: LoadedModel, script: SessionScript, settings: SessionSettings) -> WhatIfResult:
    what_if = WHAT_IFS["timestamp-position"]
    # Two sessions started seconds apart, the time written at the start vs the end of the system prompt.
    start_a, start_b = _timestamped_prompts(model, script, "start", settings.kwargs)
    end_a, end_b = _timestamped_prompts(model, script, "end", settings.kwargs)
    start = _second_session_reuse(settings, start_a, start_b)
    end = _second_session_reuse(settings, end_a, end_b)
    request = WhatIfRequest(1, len(start_b), len(end_b), start.token, end.token, start.block, end.block,
                            start.hybrid, end.hybrid)
    plain = shared_across_sessions(model, script, settings.kwargs)
    description = (f"{what_if.title}: two sessions started seconds apart share {start.token} tokens with the time "
                   f"at the start of the system prompt, {end.token} with it at the end ({plain} without a "
                   f"timestamp; {start.block} vs {end.block} in whole {settings.block_size}-token blocks)")
    return WhatIfResult(what_if.name, what_if.title, description, "timestamp at the start of the system prompt",
                        "timestamp at the end of the system prompt", (request,), settings.block_size)


# A tool a client might enable mid-task when a script names none (what_if.added_tool overrides it).
DEFAULT_ADDED_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_current_time", "description": "Return the current date and time",
                 "parameters": {"type": "object", "properties": {}}},
}

WHAT_IFS: dict[str, WhatIf] = {w.name: w for w in (
    WhatIf("history-kept", "history kept",
           "the template's default kwargs vs the ones that keep earlier turns' reasoning (computed by flipping each "
           "boolean kwarg; append-only when no kwarg does)", _history_kept),
    WhatIf("timestamp-position", "timestamp position",
           "two unrelated sessions whose system prompt carries the current time at its start vs its end",
           _timestamp),
    WhatIf("tool-added", "tool added",
           "one more tool appended to the tool list from request what_if.tools_change_request (default 2)",
           lambda m, s, o: _tools_changed(m, s, o, "tool-added")),
    WhatIf("tools-reordered", "tools reordered",
           "the tool list sent in reverse order from request what_if.tools_change_request (default 2)",
           lambda m, s, o: _tools_changed(m, s, o, "tools-reordered")),
    WhatIf("unrelated-sessions", "two unrelated sessions",
           "the first request of a second, unrelated session against a cache holding the first session's",
           _unrelated),
    WhatIf("tool-result-summarised", "tool result summarised",
           "an older tool result replaced by a summary from a later request on (what_if.summary)", _summarised),
)}


def what_if_names() -> list[str]:
    return list(WHAT_IFS)


def run_what_if(name: str, model: LoadedModel, script: SessionScript,
                settings: SessionSettings | None = None) -> WhatIfResult:
    what_if = WHAT_IFS.get(name)
    if what_if is None:
        raise ExplorerError(f"unknown what-if {name!r}; known: {', '.join(WHAT_IFS)}")
    return what_if.run(model, script, settings or SessionSettings())
