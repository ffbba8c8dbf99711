"""Why a trace step broke: replay it through our model of production and attribute the break as a matrix cell does.

The replay starts from what was really generated: request k-1's completion ids decoded with the model's tokenizer.
That text goes through the engine's parsers (the engine@version the user names, the model's parser pair by the
engine's names), comes back as the assistant message a client sends, and request k is rebuilt from request k-1's
messages, that message and the messages the client really appended; the engine's request side and the model's
template render it. When the replay gives request k's real prompt ids, the break is ours to explain and the cause
follows engine.blame's rules: same text and different ids is the tokenizer; a break that the format's lossless
split does not have is the engine's edit at the break; otherwise the template line that emitted the first differing
character. Fix hints are computed the same way (each boolean template kwarg flipped, the other engine versions,
else the bridge). When the replay does not give the real prompt, that is the finding: the client (or the server)
did something our model of it lacks, and the report says where the two prompts part and which field of the
assistant message the client sent differs from what the engine returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.blame import _classify_template, _edit_at_break
from engine.errors import ExplorerError
from engine.models import LoadedModel
from engine.prefix import common_prefix
from engine.simulate import Boundary, Cause, PrefixCheck
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
from engine.types import Rendered


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

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "reproduced": self.reproduced, "detail": self.detail,
                "cause": self.cause.to_json() if self.cause else None, "differs_at_token": self.differs_at_token,
                "differs_at_char": self.differs_at_char, "real_snippet": self.real_snippet,
                "replay_snippet": self.replay_snippet}


def _calls_before(messages: list[dict]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


@dataclass(frozen=True)
class _Step:
    """A step replayed through one engine with one set of kwargs."""

    boundary: Boundary
    replay_message: dict


def _replay(model: LoadedModel, served: Served, previous: TraceRequest, completion_ids: tuple[int, ...],
            prompt_ids: tuple[int, ...], appended: list[dict], real_reply: dict | None, kwargs: dict[str, Any],
            index: int) -> _Step:
    assert model.tokenizer is not None and previous.messages is not None
    tools = list(previous.tools or []) or None
    sent = list(previous.messages)
    prev_prompt, _ = render_request(model, served, sent, tools, kwargs)
    completion = completion_of(model, model.tokenizer.decode(completion_ids))
    parsed = parse_completion(model, served, completion, tools, kwargs, _calls_before(sent))
    call_ids = [c.get("id") for c in (real_reply or {}).get("tool_calls") or [] if isinstance(c, dict)]
    message = returned_message(parsed, call_ids, _calls_before(sent))
    next_prompt, request_edits = render_request(model, served, sent + [message] + appended, tools, kwargs)
    next_ids = model.tokenizer.encode(next_prompt.text).ids
    prev_text = prev_prompt.text + completion.text
    prev_ids = prompt_ids + completion_ids
    boundary = Boundary(index, "tool" if appended and appended[0].get("role") == "tool" else "user", prev_prompt,
                        completion, completion_ids, prompt_ids, parsed, request_edits, next_prompt, next_ids,
                        PrefixCheck(len(prev_text), common_prefix(prev_text, next_prompt.text)),
                        PrefixCheck(len(prev_ids), common_prefix(prev_ids, next_ids)))
    return _Step(boundary, message)


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


def explain_step(model: LoadedModel, engine: str, previous: TraceRequest, current: TraceRequest,
                 completion_ids: tuple[int, ...], previous_prompt_ids: tuple[int, ...],
                 prompt_ids: tuple[int, ...], index: int, *, hints: bool = True) -> Replay:
    """Replay the step from `previous` (its prompt and completion ids) to `current` (its real prompt ids)."""
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
        cause = Cause(stage="client", kind="history-rewritten", location=f"{current.format}:{current.where}",
                      origin="client", detail=f"the client sent message {at} differently from the previous request "
                      f"({str(before[at] if at < len(before) else None)[:60]!r} -> "
                      f"{str(after[at] if at < len(after) else None)[:60]!r})", fix=None)
        return Replay(served.spec, False, cause, "the client rewrote the history before the new reply, so the "
                      "break is the client's, not the engine's or the template's")
    real_reply = after[len(before)] if len(after) > len(before) else None
    appended = after[len(before) + 1:]
    kwargs = template_kwargs(model, previous.chat_template_kwargs)
    try:
        step = _replay(model, served, previous, completion_ids, previous_prompt_ids, appended, real_reply, kwargs,
                       index)
    except ExplorerError as err:
        return Replay(served.spec, False, None, f"the replay through {served.spec} fails: {err}")
    b = step.boundary
    assert b.next_ids is not None
    if b.next_ids != tuple(prompt_ids):
        token = common_prefix(b.next_ids, tuple(prompt_ids))
        real_text = model.tokenizer.decode(prompt_ids)
        char = common_prefix(real_text, b.next_prompt.text)
        diffs = _differences(real_reply, step.replay_message)
        detail = (f"the replay through {served.spec} does not give the real prompt: they part at token {token} "
                  f"(char {char})")
        cause = None
        if not previous.tools:
            detail += f"; {current.format} records no tool list, so the replay renders the prompts without tools"
        if diffs:
            detail += "; the client sent the assistant turn with " + "; ".join(diffs)
            cause = Cause(stage="client", kind="client-message-differs", location=f"{current.format}:"
                          f"{current.where}", origin="client", detail="; ".join(diffs), fix=None)
        return Replay(served.spec, False, cause, detail, token, char, real_text[char:char + 40],
                      b.next_prompt.text[char:char + 40], b)
    cause = _attribute(model, served, previous, current, b, kwargs, appended, real_reply, hints)
    return Replay(served.spec, True, cause, f"the replay through {served.spec} gives the real prompt; "
                  f"cause: {cause.stage} ({cause.kind}) at {cause.location}", boundary=b)


def _holds(model: LoadedModel, engine: str, previous: TraceRequest, completion_ids: tuple[int, ...],
           prompt_ids: tuple[int, ...], appended: list[dict], real_reply: dict | None, kwargs: dict[str, Any],
           index: int) -> bool:
    try:
        b = _replay(model, served_by(engine), previous, completion_ids, prompt_ids, appended, real_reply, kwargs,
                    index).boundary
    except ExplorerError:
        return False
    return b.holds


def _fix_hint(model: LoadedModel, served: Served, previous: TraceRequest, b: Boundary, kwargs: dict[str, Any],
              appended: list[dict], real_reply: dict | None, stage: str) -> dict:
    assert b.completion_ids is not None and b.prev_prompt_ids is not None
    args = (previous, b.completion_ids, b.prev_prompt_ids, appended, real_reply)
    for kwarg in model.spec.template_kwargs:
        value = kwargs.get(kwarg.name)
        if isinstance(value, bool) and _holds(model, served.spec, *args, {**kwargs, kwarg.name: not value}, b.index):
            return {"kind": "kwarg", "kwarg": kwarg.name, "value": not value,
                    "text": f"set {kwarg.name}={'true' if not value else 'false'}"}
    if stage == "parser" and served.emulation is not None:
        from engine.parsers import list_engines

        for other in list_engines():
            if other != served.spec and _holds(model, other, *args, kwargs, b.index):
                return {"kind": "engine", "engine": other, "text": f"serve with {other}"}
    return {"kind": "bridge", "engine": "bridge",
            "text": "build the next prompt by appending to the previous token ids (bridge) instead of re-rendering"}


def _attribute(model: LoadedModel, served: Served, previous: TraceRequest, current: TraceRequest, b: Boundary,
               kwargs: dict[str, Any], appended: list[dict], real_reply: dict | None, hints: bool) -> Cause:
    def hint(stage: str) -> dict | None:
        return _fix_hint(model, served, previous, b, kwargs, appended, real_reply, stage) if hints else None

    if b.string_prefix.holds:
        at = b.token_prefix.common if b.token_prefix else 0
        prev_ids, next_ids = b.prev_ids or (), b.next_ids or ()
        return Cause(stage="tokenizer", kind="token-boundary", location=f"{model.spec.assets['tokenizer'].hub_file}:0"
                     if "tokenizer" in model.spec.assets else "tokenizer:0", origin=f"tokenizer {model.id}",
                     detail=f"same text, different ids at token {at}: previous {list(prev_ids[at:at + 3])} vs next "
                            f"{list(next_ids[at:at + 3])}; re-tokenizing the prompt does not give back the "
                            "completion's own ids", fix=hint("tokenizer"))
    if served.emulation is not None:
        assert b.completion_ids is not None and b.prev_prompt_ids is not None
        raw = _replay(model, served_by("raw"), previous, b.completion_ids, b.prev_prompt_ids, appended, real_reply,
                      kwargs, b.index).boundary
        edits = [e for e in (*b.parse.edits, *b.request_edits) if e.before != e.after]
        if raw.string_prefix.holds and edits:
            edit = _edit_at_break(edits, b)
            return Cause(stage="parser", kind=edit.step, location=str(edit.location), origin=edit.location.origin,
                         detail=f"{edit.description}: {edit.before[:80]!r} -> {edit.after[:80]!r}", fix=hint("parser"))
    at = b.string_prefix.common
    rendered: Rendered = b.next_prompt
    pos = min(at, len(rendered.text) - 1)
    if 0 < pos < len(rendered.text) and rendered.source_line[pos] != rendered.source_line[pos - 1]:
        pos -= 1  # the chunk before the break ended early: blame the line that emitted it
    line = rendered.source_line[pos] if pos >= 0 else 0
    lines = model.renderer.source_lines()
    line_text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return Cause(stage="template", kind=_classify_template(b, at), location=f"{rendered.source_path}:{line}",
                 origin=rendered.origin, detail=f"at char {at}: previous {b.prev_text[at:at + 24]!r} vs next "
                 f"{rendered.text[at:at + 24]!r}; emitted by: {line_text[:120]}", fix=hint("template"),
                 line_text=line_text)
