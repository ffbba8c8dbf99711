"""Why a trace step broke: replay it through our model of production and attribute the break as a matrix cell does.

The replay starts from what was really generated: request k-1's completion ids decoded with the model's tokenizer.
That text goes through the engine's parsers (the engine@version the user names, the model's parser pair by the
engine's names), comes back as the assistant message a client sends, and request k is rebuilt from request k-1's
messages, that message and the messages the client really appended; the engine's request side and the model's
template render it. A client that sent the turn back without the reasoning the engine returned is modelled as the
matrix's `send_reasoning: false` client. When the replay gives request k's real prompt ids, the break is explained by
engine.blame's counterfactuals, exactly as for a matrix cell: this module hands blame a re-run function that replays
the same step with one change (an engine edit undone, a template construct undone, an echoing client, other kwargs,
another engine version, the bridge). When the replay does not give the real prompt, that is the finding: the client
(or the server) did something our model of it lacks; the report says where the two prompts part and which field of
the assistant message the client sent differs from what the engine returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.blame import BlameContext, explain_break
from engine.errors import ExplorerError
from engine.formats import get_format
from engine.models import LoadedModel
from engine.prefix import common_prefix
from engine.scenario import Scenario
from engine.serving.bridge import bridge_prompt
from engine.serving.raw import raw_request
from engine.serving.spec import EngineSpec
from engine.simulate import rerender
from engine.traces.pipeline import (
    Served,
    completion_of,
    parse_completion,
    render_request,
    returned_message,
    served_by,
    template_kwargs,
)
from engine.traces.records import TraceRequest
from engine.types import (
    Boundary,
    Cause,
    Change,
    EchoingClient,
    Edit,
    ParseResult,
    PrefixCheck,
    UndoRequestEdit,
    UndoTemplate,
    UseParse,
    WithEngine,
    WithKwargs,
)


@dataclass(frozen=True)
class Replay:
    """The replay of one break: whether it gives the real next prompt, and the cause when it does."""

    engine: str
    reproduced: bool
    cause: Cause | None
    detail: str  # one sentence: what the replay found
    differs_at_token: int | None = None  # where the replayed prompt parts from the real one (not reproduced)
    differs_at_char: int | None = None
    real_snippet: str = ""
    replay_snippet: str = ""
    boundary: Boundary | None = None  # the replayed step, for the break view
    # A reproduced break whose attribution was deferred (blame re-renders the prompt once per candidate change).
    pending: Callable[[], Cause] | None = field(default=None, compare=False, repr=False)

    def attributed(self) -> Replay:
        """This replay with its cause attributed (itself when it already is, or cannot be)."""
        if self.pending is None:
            return self
        cause = self.pending()
        return replace(self, cause=cause, pending=None, detail=_reproduced(self.engine, self.detail, cause))

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "reproduced": self.reproduced, "detail": self.detail,
                "cause": self.cause.to_json() if self.cause else None, "differs_at_token": self.differs_at_token,
                "differs_at_char": self.differs_at_char, "real_snippet": self.real_snippet,
                "replay_snippet": self.replay_snippet}


@dataclass(frozen=True)
class _Step:
    """What one replay needs besides the engine, the kwargs and the change: the two requests and the real ids."""

    model: LoadedModel
    previous: TraceRequest
    completion_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...]  # request k-1's logged prompt
    appended: list[dict]  # what the client really appended after the assistant turn
    real_reply: dict | None  # the assistant turn the client really sent
    index: int
    send_reasoning: bool = True


def _calls_before(messages: list[dict]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def _replay(step: _Step, served: Served, kwargs: dict[str, Any], *, parse: ParseResult | None = None,
            request_undo: Edit | None = None, logged_ids: bool = True, echo: bool = False) -> Boundary:
    model = step.model
    assert model.tokenizer is not None and step.previous.messages is not None
    tools = list(step.previous.tools or []) or None
    sent = list(step.previous.messages)
    prev_prompt, _, _ = render_request(model, served, sent, tools, kwargs)
    completion = completion_of(model, model.tokenizer.decode(step.completion_ids))
    parsed = parse or parse_completion(model, served, completion, tools, kwargs, _calls_before(sent))
    call_ids = [c.get("id") for c in (step.real_reply or {}).get("tool_calls") or [] if isinstance(c, dict)]
    message = returned_message(parsed, call_ids, _calls_before(sent))
    if not step.send_reasoning and not echo:
        message.pop("reasoning_content", None)
    messages = sent + [message] + step.appended
    next_prompt, request_edits, request = render_request(model, served, messages, tools, kwargs, undo=request_undo)
    # Request k-1's prompt as logged; a re-run with other kwargs renders it again, as the server would have.
    prompt_ids = step.prompt_ids if logged_ids else model.tokenizer.encode(prev_prompt.text).ids
    next_ids = model.tokenizer.encode(next_prompt.text).ids
    prev_text, prev_ids = prev_prompt.text + completion.text, prompt_ids + step.completion_ids
    trigger = "tool" if step.appended and step.appended[0].get("role") == "tool" else "user"
    return Boundary(step.index, trigger, prev_prompt, completion, step.completion_ids, prompt_ids, parsed,
                    request_edits, next_prompt, next_ids,
                    PrefixCheck(len(prev_text), common_prefix(prev_text, next_prompt.text)),
                    PrefixCheck(len(prev_ids), common_prefix(prev_ids, next_ids)), request)


def _bridged(step: _Step, broken: Boundary) -> Boundary:
    """The append-only next prompt (engine.simulate's bridge) over the replayed step."""
    model = step.model
    assert model.tokenizer is not None and step.previous.messages is not None
    assistant_index = len(step.previous.messages)
    request = broken.next_request
    tools, kwargs = (request.tools, request.kwargs) if request is not None else (None, {})
    assistant = request.messages[assistant_index] if request is not None else {}
    arguments = get_format(model.spec.family).arguments_in_history
    prompt = bridge_prompt(model, broken.prev_prompt, broken.completion, assistant, step.appended, assistant_index,
                           lambda messages: model.renderer.render(raw_request(messages, arguments), tools,
                                                                  add_generation_prompt=True, kwargs=kwargs))
    appended = prompt.text[len(broken.prev_text):]
    prev_ids = broken.prev_ids or ()
    next_ids = prev_ids + model.tokenizer.encode(appended).ids
    return replace(broken, next_prompt=prompt, next_ids=next_ids,
                   string_prefix=PrefixCheck(len(broken.prev_text), common_prefix(broken.prev_text, prompt.text)),
                   token_prefix=PrefixCheck(len(prev_ids), common_prefix(prev_ids, next_ids)))


def _rerun_function(step: _Step, served: Served, kwargs: dict[str, Any], broken: Boundary):
    """What blame is given: the breaking step replayed again with one change (None: the replay failed)."""

    def rerun(change: Change) -> Boundary | None:
        try:
            if isinstance(change, UndoTemplate):
                return rerender(step.model, change.base or broken, change)
            if isinstance(change, UseParse):
                return _replay(step, served, kwargs, parse=change.parse)
            if isinstance(change, UndoRequestEdit):
                return _replay(step, served, kwargs, request_undo=change.edit)
            if isinstance(change, EchoingClient):
                return _replay(step, served, kwargs, echo=True)
            if isinstance(change, WithKwargs):
                return _replay(step, served, {**kwargs, **change.kwargs}, logged_ids=False)
            if isinstance(change, WithEngine):
                if change.engine.kind == "bridge":
                    return _bridged(step, broken)
                return _replay(step, served_by(change.engine), kwargs)
        except ExplorerError:
            return None
        raise TypeError(f"unknown change {change!r}")

    return rerun


def _differences(real: dict | None, replayed: dict) -> list[str]:
    if real is None:
        return ["the client sent no assistant message for this reply"]
    out = []
    for key in ("content", "reasoning_content", "tool_calls"):
        a, b = real.get(key), replayed.get(key)
        if key == "tool_calls":
            a = [(c.get("function", {}).get("name"), c.get("function", {}).get("arguments")) for c in a or []]
            b = [(c["function"]["name"], c["function"]["arguments"]) for c in b or []]
        if (a or None) != (b or None):
            out.append(f"{key} {str(a)[:60]!r} where the engine returned {str(b)[:60]!r}")
    return out


def explain_step(model: LoadedModel, engine: EngineSpec | str, previous: TraceRequest, current: TraceRequest,
                 completion_ids: tuple[int, ...], previous_prompt_ids: tuple[int, ...],
                 prompt_ids: tuple[int, ...], index: int, *, hints: bool = True, attribute_now: bool = True) -> Replay:
    """Replay the step from `previous` (its prompt and completion ids) to `current` (its real prompt ids);
    `attribute_now=False` defers blame to `Replay.attributed()`."""
    served = served_by(engine)
    if model.tokenizer is None:
        return Replay(served.spec, False, None, f"model {model.id} has no tokenizer here, so the completion ids "
                      "cannot be decoded for the replay")
    if previous.messages is None or current.messages is None:
        return Replay(served.spec, False, None, f"{current.where}: the log carries no request messages, so the step "
                      "cannot be replayed (vLLM: VLLM_REQUEST_BODY_LOG_LEVEL=DEBUG logs the JSON body; SGLang: "
                      "give each request a rid, then request.received.openai carries the messages)")
    before, after = list(previous.messages), list(current.messages)
    if after[:len(before)] != before:
        at = next(i for i, (a, b) in enumerate(zip(before + [{}], after + [{}])) if a != b)
        return Replay(served.spec, False, None, f"the client rewrote the history: message {at} of {current.where} "
                      f"differs from the previous request's ({str(before[at] if at < len(before) else None)[:60]!r} "
                      f"-> {str(after[at] if at < len(after) else None)[:60]!r}), so the break is the client's")
    real_reply = after[len(before)] if len(after) > len(before) else None
    step = _Step(model, previous, completion_ids, previous_prompt_ids, after[len(before) + 1:], real_reply, index)
    kwargs = template_kwargs(model, previous.chat_template_kwargs)
    try:
        broken = _replay(step, served, kwargs)
        replayed_reply = returned_message(broken.parse, [c.get("id") for c in (real_reply or {}).get("tool_calls")
                                                         or [] if isinstance(c, dict)], _calls_before(before))
        if broken.next_ids != tuple(prompt_ids) and real_reply is not None and \
                "reasoning_content" not in real_reply and replayed_reply.get("reasoning_content") is not None:
            # A client that keeps only content and tool calls: the matrix's send_reasoning: false.
            step = replace(step, send_reasoning=False)
            broken = _replay(step, served, kwargs)
    except ExplorerError as err:
        return Replay(served.spec, False, None, f"the replay through {served.spec} fails: {err}")
    assert broken.next_ids is not None
    if broken.next_ids != tuple(prompt_ids):
        token = common_prefix(broken.next_ids, tuple(prompt_ids))
        real_text = model.tokenizer.decode(prompt_ids)
        char = common_prefix(real_text, broken.next_prompt.text)
        detail = (f"the replay through {served.spec} does not give the real prompt: they part at token {token} "
                  f"(char {char})")
        if not previous.tools:
            detail += f"; {current.format} records no tool list, so the replay renders the prompts without tools"
        diffs = _differences(real_reply, replayed_reply)
        if diffs:
            detail += "; the client sent the assistant turn with " + "; ".join(diffs)
        return Replay(served.spec, False, None, detail, token, char, real_text[char:char + 40],
                      broken.next_prompt.text[char:char + 40], broken)
    client = {} if step.send_reasoning else {"send_reasoning": False}
    scenario = Scenario(id=f"{current.format}:{current.where}", description="", tools=list(previous.tools or [])
                        or None, system=None, turns=(), kwargs={}, source="", client=client)
    context = BlameContext(model, scenario, served.engine, dict(previous.chat_template_kwargs or {}), kwargs)
    detail = (f"the replay through {served.spec}{' with a client that drops the reasoning' if client else ''} gives "
              "the real prompt")

    def attribute() -> Cause:
        return explain_break(broken, context, _rerun_function(step, served, kwargs, broken), hints=hints)

    replay = Replay(served.spec, True, None, detail, boundary=broken, pending=attribute)
    return replay.attributed() if attribute_now else replay


def _reproduced(engine: str, detail: str, cause: Cause) -> str:
    return f"{detail}; cause: {cause.stage} ({cause.kind}) at {cause.location}"
