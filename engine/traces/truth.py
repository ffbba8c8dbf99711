"""Sessions from requests, and the ground truth of every step: what the prefix cache could reuse.

Grouping: by the format's own session id where it has one; otherwise a request joins the earlier session whose
latest sequence (prompt + completion) shares the longest token prefix with its prompt, provided the prompt still
holds that session's first prompt up to its generation prompt (`FIRST_PROMPT_SLACK` tokens short of its end at
most); else it starts a session. Candidates are found through a hash chain of 16-token blocks (as vLLM's prefix
cache keys blocks), so grouping costs one pass over each request's tokens.

Per step (request k of a session, k >= 2): the token-level common prefix of (request k-1's prompt ids + its
completion ids) and request k's prompt ids, the first differing token, tokens reused and re-prefilled, and at a
break the same at string level after decoding both with the model's tokenizer. Reuse at token, block and hybrid
granularity comes from engine.session's accounting (`reuse_of`, `checkpoints_after`, `RequestRow`); the cache is
the session's earlier sequences, less those that are a prefix of a later one (their hybrid checkpoints move to
it, which keeps `reuse_of`'s answer exact), so an append-only session compares each prompt with one sequence.

Formats without token ids (agent logs of messages) are rendered instead: each prompt from the client's messages
with the model's template, each completion written as the model's output from the returned message
(engine/formats), tokenized with the model's tokenizer; `ids_source` says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ExplorerError
from engine.formats import get_format
from engine.models import LoadedModel
from engine.prefix import common_prefix
from engine.session import CachedSequence, RequestRow, checkpoints_after, reuse_of
from engine.traces.pipeline import render_request, served_by, template_kwargs, turn_of
from engine.traces.records import TraceRequest

HASH_BLOCK = 16
FIRST_PROMPT_SLACK = 4  # a generation prompt past the role header: Qwen3 "<think>\n" is 2 tokens


@dataclass
class TraceSession:
    key: str  # the format's session id, or "prefix-N" for a session found by shared prefix
    requests: list[TraceRequest] = field(default_factory=list)


def _chain(ids: tuple[int, ...], limit: int | None = None) -> Iterable[int]:
    h = 0
    end = len(ids) if limit is None else min(limit, len(ids))
    for start in range(0, end - HASH_BLOCK + 1, HASH_BLOCK):
        h = hash((h, ids[start:start + HASH_BLOCK]))
        yield h


def group_sessions(requests: Iterable[tuple[TraceRequest, tuple[int, ...], tuple[int, ...]]]) -> list[TraceSession]:
    """Requests (each with its prompt and completion ids) in sessions, in the order of their first request."""
    sessions: dict[str, TraceSession] = {}
    first_prompt: dict[str, tuple[int, ...]] = {}
    latest: dict[str, tuple[int, ...]] = {}
    deepest: dict[int, str] = {}  # block-chain hash -> the session whose latest sequence last held it
    for request, prompt, completion in requests:
        key = request.session
        if key is None:
            candidate = None
            for h in _chain(prompt):
                owner = deepest.get(h)
                if owner is None:
                    break
                candidate = owner
            if candidate is not None:
                first = first_prompt[candidate]
                if common_prefix(prompt, first) < len(first) - FIRST_PROMPT_SLACK:
                    candidate = None
            key = candidate or f"prefix-{len(sessions) + 1}"
        if key not in sessions:
            sessions[key] = TraceSession(key)
            first_prompt[key] = prompt
        sessions[key].requests.append(request)
        if request.session is None:
            sequence = prompt + completion
            latest[key] = sequence
            for h in _chain(sequence):
                deepest[h] = key
    for session in sessions.values():
        session.requests.sort(key=lambda r: r.order)  # a log records outputs as they finish, not as requests came
    ordered = sorted(sessions.values(), key=lambda s: s.requests[0].order)
    for n, session in enumerate(ordered, start=1):
        if session.key.startswith("prefix-"):
            session.key = f"prefix-{n}"  # numbered in the order of their first request
    return ordered


@dataclass(frozen=True)
class StepBreak:
    """Where request k's prompt parts from request k-1's sequence."""

    token: int  # first differing token position (== the common prefix)
    previous_token: int | None  # id at that position in the previous sequence (None: past its end)
    next_token: int | None
    previous_token_text: str | None
    next_token_text: str | None
    char: int  # first differing character after decoding both
    previous_snippet: str
    next_snippet: str
    token_only: bool  # the decoded texts agree through the previous sequence; only the ids differ

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TraceStep:
    request: TraceRequest
    row: RequestRow  # the session accounting's figures for this request
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    common_with_previous: int  # token prefix shared with the previous request's whole sequence
    first_break: StepBreak | None

    @property
    def breaks(self) -> bool:
        return self.first_break is not None


@dataclass(frozen=True)
class SessionTruth:
    key: str
    steps: tuple[TraceStep, ...]
    ids_source: str  # "logged" or "rendered"

    @property
    def prompt_tokens(self) -> int:
        return sum(s.row.prompt_tokens for s in self.steps)

    @property
    def reused_tokens(self) -> int:
        return sum(s.row.reusable_tokens for s in self.steps)

    @property
    def lost_tokens(self) -> int:
        """Cache lost: tokens of earlier sequences prefilled again because a prompt parted from them."""
        return sum(s.row.previous_sequence_tokens - s.row.reusable_tokens for s in self.steps if s.row.breaks)

    @property
    def breaks(self) -> int:
        return sum(1 for s in self.steps if s.breaks)


def ids_of(model: LoadedModel | None, request: TraceRequest, engine: str | None) -> tuple[tuple[int, ...],
                                                                                         tuple[int, ...], str]:
    """The request's prompt and completion ids: logged, or rendered from its messages with the model's template."""
    if request.has_ids:
        assert request.prompt_ids is not None and request.completion_ids is not None
        return request.prompt_ids, request.completion_ids, "logged"
    if model is None or model.tokenizer is None:
        raise ExplorerError(f"{request.where}: {request.format} logs no token ids, so the prompts are rendered with "
                            "the model's template: name a model with a tokenizer (--model)")
    if request.messages is None or request.response_message is None:
        raise ExplorerError(f"{request.where}: neither token ids nor the messages and the reply are logged")
    kwargs = template_kwargs(model, request.chat_template_kwargs)
    served = served_by(engine or "raw")
    prompt, _ = render_request(model, served, list(request.messages), list(request.tools or []) or None, kwargs)
    stop = model.spec.stop_tokens[0] if model.spec.stop_tokens else ""
    completion = get_format(model.spec.family).write(turn_of(request.response_message, request.where), stop)
    return model.tokenizer.encode(prompt.text).ids, model.tokenizer.encode(completion.text).ids, "rendered"


def _step_break(model: LoadedModel | None, previous: tuple[int, ...], prompt: tuple[int, ...]) -> StepBreak:
    at = common_prefix(previous, prompt)
    tokenizer = model.tokenizer if model is not None else None

    def text(ids: tuple[int, ...], i: int) -> tuple[int | None, str | None]:
        if i >= len(ids):
            return None, None
        return ids[i], tokenizer.token_text(ids[i]) if tokenizer else None

    prev_id, prev_text = text(previous, at)
    next_id, next_text = text(prompt, at)
    if tokenizer is None:
        return StepBreak(at, prev_id, next_id, None, None, -1, "", "", False)
    a, b = tokenizer.decode(previous), tokenizer.decode(prompt)
    char = common_prefix(a, b)
    return StepBreak(at, prev_id, next_id, prev_text, next_text, char, a[char:char + 40], b[char:char + 40],
                     char >= len(a))


def session_truth(model: LoadedModel | None, session: TraceSession,
                  ids: dict[int, tuple[tuple[int, ...], tuple[int, ...]]], ids_source: str, *, block_size: int = 16,
                  checkpoint_policy: str = "prompt-and-generation-end") -> SessionTruth:
    """Every request of a session with its reuse; `ids` maps id(request) to its (prompt, completion) ids."""
    frontier: list[tuple[int, CachedSequence]] = []  # (request number, sequence) no later sequence extends
    steps: list[TraceStep] = []
    previous: tuple[int, ...] = ()
    for n, request in enumerate(session.requests, start=1):
        prompt, completion = ids[id(request)]
        reuse = reuse_of(prompt, [c for _, c in frontier], block_size)
        common = common_prefix(previous, prompt) if previous else 0
        row = RequestRow(
            index=n, trigger="request", prompt_tokens=len(prompt), reusable_tokens=reuse.token,
            prefill_tokens=len(prompt) - reuse.token, decode_tokens=len(completion),
            block_reusable_tokens=reuse.block, hybrid_reusable_tokens=reuse.hybrid,
            sequence_tokens=len(prompt) + len(completion), previous_sequence_tokens=len(previous),
            matched_request=frontier[reuse.matched][0] if reuse.matched >= 0 else 0,
        )
        first_break = _step_break(model, previous, prompt) if previous and common < len(previous) else None
        steps.append(TraceStep(request, row, prompt, completion, common, first_break))
        sequence = prompt + completion
        kept: list[tuple[int, CachedSequence]] = []
        checkpoints = set(checkpoints_after(len(prompt), len(sequence), checkpoint_policy))
        for number, cached in frontier:
            if len(cached.ids) <= len(sequence) and common_prefix(cached.ids, sequence) == len(cached.ids):
                checkpoints.update(cached.checkpoints)  # a prefix of the new sequence: its state lives on there
            else:
                kept.append((number, cached))
        frontier = kept + [(n, CachedSequence(sequence, tuple(sorted(checkpoints))))]
        previous = sequence
    return SessionTruth(session.key, tuple(steps), ids_source)
