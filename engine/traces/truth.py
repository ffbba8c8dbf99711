"""The ground truth of every step of a session: what the prefix cache could reuse.

Requests are grouped into sessions by grouping.py (the conversation each continues).

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

from dataclasses import dataclass, field, replace
from typing import Any

from engine.errors import ExplorerError
from engine.formats import get_format
from engine.models import LoadedModel
from engine.prefix import common_prefix
from engine.serving.spec import EngineSpec
from engine.session import CachedSequence, RequestRow, checkpoints_after, reuse_of
from engine.traces.pipeline import render_request, served_by, template_kwargs, turn_of
from engine.traces.records import TraceRequest


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
    request: TraceRequest  # without its ids and messages (kept only while the next request may need them)
    row: RequestRow  # the session accounting's figures for this request
    common_with_previous: int  # token prefix shared with the previous request's whole sequence
    first_break: StepBreak | None
    # At a break only: both sides, for the break view and the evidence.
    previous_sequence_ids: tuple[int, ...] | None = field(default=None, repr=False)
    prompt_ids: tuple[int, ...] | None = field(default=None, repr=False)

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


def ids_of(model: LoadedModel | None, request: TraceRequest, engine: EngineSpec | None) -> tuple[tuple[int, ...],
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
    served = served_by(engine or EngineSpec("raw"))
    prompt, _, _ = render_request(model, served, list(request.messages), list(request.tools or []) or None, kwargs)
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


def lite(request: TraceRequest) -> TraceRequest:
    """The request without what grows with the conversation (ids, messages, texts): what a step keeps."""
    return replace(request, prompt_ids=None, completion_ids=None, prompt_text=None, completion_text=None,
                   messages=None, tools=None, response_message=None)


class SessionBuilder:
    """One session's steps, computed as its requests arrive. The cache is the session's earlier sequences less
    those a later one extends (their hybrid checkpoints move to it): `reuse_of` gives the same answer as over every
    earlier sequence, and an append-only session compares each prompt with one sequence."""

    def __init__(self, key: str, model: LoadedModel | None, ids_source: str, block_size: int,
                 checkpoint_policy: str) -> None:
        self.key, self.model, self.block_size, self.policy = key, model, block_size, checkpoint_policy
        self.ids_sources = {ids_source}
        self.steps: list[TraceStep] = []
        self.frontier: list[tuple[int, CachedSequence]] = []  # (request number, sequence) no later one extends
        self.previous: tuple[int, ...] = ()
        self.previous_request: TraceRequest | None = None  # whole, for the replay of a break at the next request
        self.previous_prompt: tuple[int, ...] = ()
        self.previous_completion: tuple[int, ...] = ()
        self.first_order = 0

    def add(self, request: TraceRequest, prompt: tuple[int, ...], completion: tuple[int, ...],
            ids_source: str) -> TraceStep:
        self.ids_sources.add(ids_source)
        n = len(self.steps) + 1
        if n == 1:
            self.first_order = request.order
        previous = self.previous
        reuse = reuse_of(prompt, [c for _, c in self.frontier], self.block_size)
        common = common_prefix(previous, prompt) if previous else 0
        row = RequestRow(
            index=n, trigger="request", prompt_tokens=len(prompt), reusable_tokens=reuse.token,
            prefill_tokens=len(prompt) - reuse.token, decode_tokens=len(completion),
            block_reusable_tokens=reuse.block, hybrid_reusable_tokens=reuse.hybrid,
            sequence_tokens=len(prompt) + len(completion), previous_sequence_tokens=len(previous),
            matched_request=self.frontier[reuse.matched][0] if reuse.matched >= 0 else 0,
        )
        breaks = bool(previous) and common < len(previous)
        step = TraceStep(lite(request), row, common, _step_break(self.model, previous, prompt) if breaks else None,
                         previous if breaks else None, prompt if breaks else None)
        self.steps.append(step)
        sequence = prompt + completion
        kept: list[tuple[int, CachedSequence]] = []
        checkpoints = set(checkpoints_after(len(prompt), len(sequence), self.policy))
        for number, cached in self.frontier:
            if len(cached.ids) <= len(sequence) and common_prefix(cached.ids, sequence) == len(cached.ids):
                checkpoints.update(cached.checkpoints)  # a prefix of the new sequence: its state lives on there
            else:
                kept.append((number, cached))
        self.frontier = kept + [(n, CachedSequence(sequence, tuple(sorted(checkpoints))))]
        self.previous, self.previous_request = sequence, request
        self.previous_prompt, self.previous_completion = prompt, completion
        return step

    def park(self) -> dict[str, Any]:
        """What only the session's next request needs (its cache, its latest sequence and request) and its breaks'
        two sides (the evidence's), handed over and dropped here: a session that went idle keeps its steps' figures,
        not its conversation. `resume` takes it all back."""
        state = {"frontier": self.frontier, "previous": self.previous, "previous_request": self.previous_request,
                 "previous_prompt": self.previous_prompt, "previous_completion": self.previous_completion,
                 "break_ids": {n: (step.previous_sequence_ids, step.prompt_ids) for n, step in enumerate(self.steps)
                               if step.prompt_ids is not None}}
        self.frontier, self.previous, self.previous_request = [], (), None
        self.previous_prompt = self.previous_completion = ()
        for n in state["break_ids"]:
            self.steps[n] = replace(self.steps[n], previous_sequence_ids=None, prompt_ids=None)
        return state

    def resume(self, state: dict[str, Any]) -> None:
        self.frontier, self.previous, self.previous_request = (state["frontier"], state["previous"],
                                                               state["previous_request"])
        self.previous_prompt, self.previous_completion = state["previous_prompt"], state["previous_completion"]
        for n, (previous, prompt) in state["break_ids"].items():
            self.steps[n] = replace(self.steps[n], previous_sequence_ids=previous, prompt_ids=prompt)

    def truth(self) -> SessionTruth:
        source = next(iter(self.ids_sources)) if len(self.ids_sources) == 1 else "mixed"
        return SessionTruth(self.key, tuple(self.steps), source)
