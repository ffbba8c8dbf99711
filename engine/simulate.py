"""The PRR roundtrip for one matrix cell: model × scenario × engine@version × template kwargs.

For every request boundary: render the prompt, write the model's completion, let the engine parse it, build the
next request as an OpenAI client would, let the engine rewrite it, render and tokenize again, and compare the
previous prompt + completion with the next prompt (string and token longest common prefix).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from engine.errors import ExplorerError, RenderError
from engine.formats import Completion, get_format
from engine.models import LoadedModel, load_model
from engine.prefix import common_prefix
from engine.scenario import Scenario, load_scenario
from engine.tokenize import token_ids
from engine.types import Edit, ParseResult, Provenance, Rendered

ENGINES = ("vllm", "sglang", "raw", "bridge")


@dataclass(frozen=True)
class PrefixCheck:
    prev_len: int
    common: int

    @property
    def holds(self) -> bool:
        return self.common == self.prev_len

    def to_json(self) -> dict:
        return {"prev_len": self.prev_len, "common": self.common, "holds": self.holds}


@dataclass(frozen=True)
class Boundary:
    index: int  # 1-based request boundary
    trigger: str  # what the client appended: "tool" or "user"
    prev_prompt: Rendered
    completion: Completion
    completion_ids: tuple[int, ...] | None
    prev_prompt_ids: tuple[int, ...] | None
    parse: ParseResult
    request_edits: tuple[Edit, ...]
    next_prompt: Rendered
    next_ids: tuple[int, ...] | None
    string_prefix: PrefixCheck
    token_prefix: PrefixCheck | None

    @property
    def prev_text(self) -> str:
        return self.prev_prompt.text + self.completion.text

    @property
    def prev_ids(self) -> tuple[int, ...] | None:
        if self.prev_prompt_ids is None or self.completion_ids is None:
            return None
        return self.prev_prompt_ids + self.completion_ids

    @property
    def holds(self) -> bool:
        return self.string_prefix.holds and (self.token_prefix is None or self.token_prefix.holds)

    @property
    def reused_tokens(self) -> int | None:
        return self.token_prefix.common if self.token_prefix else None

    @property
    def prefill_tokens(self) -> int | None:
        return len(self.next_ids) - self.token_prefix.common if self.token_prefix and self.next_ids else None


@dataclass(frozen=True)
class Cause:
    stage: str  # parser | template | tokenizer | client
    kind: str
    location: str  # path:line[-line]
    origin: str
    detail: str
    fix: dict | None
    line_text: str = ""

    def to_json(self) -> dict:
        return {"stage": self.stage, "kind": self.kind, "location": self.location, "origin": self.origin,
                "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class CellResult:
    model: str
    scenario: str
    engine: str
    engine_version: str
    kwargs: dict[str, Any]
    status: str  # holds | breaks | error | unavailable
    boundaries: tuple[Boundary, ...] = ()
    cause: Cause | None = None
    note: str | None = None  # why a cell is error/unavailable, or why token level is missing
    asset_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def focus(self) -> Boundary | None:
        """The boundary whose figures the cell shows: the first that breaks, else the last."""
        for b in self.boundaries:
            if not b.holds:
                return b
        return self.boundaries[-1] if self.boundaries else None


def _engine_parts(engine: str) -> tuple[str, str]:
    if engine in ("raw", "bridge"):
        return engine, ""
    from engine.parsers import get_engine

    emulation = get_engine(engine)
    return emulation.name, emulation.version


def client_message(parsed: ParseResult, call_ids: list[str], *, send_reasoning: bool = True) -> dict:
    """The assistant message an OpenAI-style client sends back: what the engine returned, fields as named
    (`send_reasoning=False`: without reasoning_content, as clients that only keep content and tool_calls do)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None and send_reasoning:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c, cid in zip(parsed.tool_calls, call_ids)
        ]
    return message


def raw_request(messages: list[dict], arguments_in_history: str) -> list[dict]:
    """The raw engine hands arguments over losslessly in the form the model's own template expects."""
    if arguments_in_history != "mapping":
        return messages
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                args = c["function"]["arguments"]
                if isinstance(args, str):
                    try:
                        loaded = json.loads(args)
                        args = loaded if isinstance(loaded, dict) else args
                    except json.JSONDecodeError:
                        pass
                calls.append({**c, "function": {**c["function"], "arguments": args}})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _completion_ids(model: LoadedModel, completion: Completion, noncanonical: bool) -> tuple[int, ...] | None:
    if model.tokenizer is None:
        return None
    whole = token_ids(model.tokenizer, completion.text)
    if not noncanonical:
        return whole
    # A sampled tokenization that decodes to the same text but is not what re-tokenization gives back:
    # split one word of at least four letters in two.
    text = completion.text
    for start in range(len(text)):
        if text[start:start + 4].isalpha() and (start == 0 or not text[start - 1].isalpha()):
            cut = start + 2
            ids = token_ids(model.tokenizer, text[:cut]) + token_ids(model.tokenizer, text[cut:])
            if ids != whole and model.tokenizer.decode(ids) == text:
                return ids
    return whole


def _ids(model: LoadedModel, text: str) -> tuple[int, ...] | None:
    return token_ids(model.tokenizer, text) if model.tokenizer else None


@lru_cache(maxsize=4096)
def _cached_cell(model_id: str, scenario_id: str, engine: str, kwargs_json: str, explain: bool) -> CellResult:
    return run_cell_with(load_model(model_id), scenario_id, engine, json.loads(kwargs_json), explain=explain)


def run_cell(model_id: str, scenario_id: str, engine: str, kwargs: dict[str, Any] | None = None,
             *, explain: bool = True) -> CellResult:
    """One matrix cell. `kwargs` are template kwargs on top of the model's defaults and the scenario's."""
    return _cached_cell(model_id, scenario_id, engine, json.dumps(kwargs or {}, sort_keys=True), explain)


_LOCAL_SCENARIOS: dict[str, Scenario] = {}


@contextmanager
def local_scenario(scenario: Scenario) -> Iterator[None]:
    """Run an in-memory scenario (a fuzzed one) by its id: cause attribution re-runs cells by scenario id."""
    _LOCAL_SCENARIOS[scenario.id] = scenario
    try:
        yield
    finally:
        _LOCAL_SCENARIOS.pop(scenario.id, None)


def run_cell_with(model: LoadedModel, scenario_id: str, engine: str, user_kwargs: dict[str, Any], *,
                  explain: bool = True, hints: bool = True, stop_after: int | None = None) -> CellResult:
    """A cell for an already loaded model (e.g. one with a custom template); not cached. `hints=False`: the
    cause without its fix hint (engine.blame.explain_break). `stop_after=N`: only boundaries 1..N are computed
    (cause attribution asks whether one boundary holds), and the status is about those."""
    model_id = model.id
    scenario = _LOCAL_SCENARIOS.get(scenario_id) or load_scenario(scenario_id)
    kwargs = {**model.spec.default_kwargs(), **scenario.kwargs, **user_kwargs}
    try:
        engine_name, version = _engine_parts(engine)
    except ValueError as err:
        return CellResult(model_id, scenario_id, engine, "", kwargs, "unavailable", note=str(err))
    base = dict(model=model_id, scenario=scenario_id, engine=engine_name, engine_version=version, kwargs=kwargs,
                asset_hashes=model.asset_hashes)
    try:
        boundaries = _roundtrip(model, scenario, engine, kwargs, stop_after)
    except _Unavailable as err:
        return CellResult(**base, status="unavailable", note=str(err))
    except _Failed as err:
        return CellResult(**base, status="error", boundaries=err.boundaries, note=str(err))
    note = model.tokenizer_unavailable
    if all(b.holds for b in boundaries):
        return CellResult(**base, status="holds", boundaries=boundaries, note=note)
    cause = None
    if explain:
        from engine.blame import explain_break

        cause = explain_break(model, scenario, engine, kwargs, user_kwargs, boundaries, hints=hints)
    return CellResult(**base, status="breaks", boundaries=boundaries, cause=cause, note=note)


class _Unavailable(ExplorerError):
    pass


class _Failed(ExplorerError):
    def __init__(self, message: str, boundaries: tuple[Boundary, ...]) -> None:
        super().__init__(message)
        self.boundaries = boundaries


def _roundtrip(model: LoadedModel, scenario: Scenario, engine: str, kwargs: dict,
               stop_after: int | None = None) -> tuple[Boundary, ...]:
    fmt = get_format(model.spec.family)
    stop = model.spec.stop_tokens[0] if model.spec.stop_tokens else ""
    emulation = None
    parsers: dict[str, str] = {}
    if engine not in ("raw", "bridge"):
        from engine.parsers import get_engine

        emulation = get_engine(engine)
        parsers = emulation.parser_override or model.spec.engine_parsers.get(emulation.name, {})

    history: list[dict] = [{"role": "system", "content": scenario.system}] if scenario.system else []
    boundaries: list[Boundary] = []
    pending: tuple[Rendered, tuple | None, Completion, tuple | None, ParseResult, int] | None = None
    call_ids: list[str] = []
    call_cursor = 0
    calls_so_far = 0

    def render(messages: list[dict], generation_prompt: bool) -> tuple[Rendered, tuple[Edit, ...]]:
        edits: tuple[Edit, ...] = ()
        to_render = messages
        if emulation is not None:
            prep = emulation.prepare_request(messages, scenario.tools)
            if prep.error:
                raise _Failed(f"{emulation.origin} rejects the next request: {prep.error}", tuple(boundaries))
            to_render, edits = prep.messages, prep.edits
        else:
            to_render = raw_request(messages, fmt.arguments_in_history)
        try:
            return model.renderer.render(to_render, scenario.tools, add_generation_prompt=generation_prompt,
                                         kwargs=kwargs), edits
        except RenderError as err:
            raise _Failed(str(err), tuple(boundaries)) from err

    for turn in scenario.turns:
        if turn.role in ("user", "tool"):
            message: dict[str, Any] = {"role": turn.role, "content": turn.text}
            if turn.role == "tool":
                message["tool_call_id"] = call_ids[call_cursor] if call_cursor < len(call_ids) else "call_missing"
                call_cursor += 1
            history.append(message)
            if pending is not None:
                try:
                    boundaries.append(_close_boundary(model, engine, history, pending, render, len(boundaries) + 1,
                                                      turn.role))
                except RenderError as err:  # the bridge reads provenance, whose recording render can refuse
                    raise _Failed(str(err), tuple(boundaries)) from err
                pending = None
                if stop_after is not None and len(boundaries) >= stop_after:
                    break
            continue
        assert turn.assistant is not None
        if engine == "bridge" and boundaries:
            prompt = boundaries[-1].next_prompt
            prompt_ids = boundaries[-1].next_ids
        else:
            prompt, _ = render(history, True)
            prompt_ids = _ids(model, prompt.text)
        completion = fmt.write(turn.assistant, stop)
        completion_ids = _completion_ids(model, completion, turn.noncanonical_tokens)
        if emulation is not None:
            try:
                tool_parser = parsers.get("tool_call_parser")
                parsed = emulation.parse(emulation.output_text(completion.text, completion.stop_token, tool_parser),
                                         reasoning_parser=parsers.get("reasoning_parser"), tool_parser=tool_parser,
                                         tools=scenario.tools, chat_template_kwargs=kwargs,
                                         history_tool_calls=calls_so_far, tokenizer=model.tokenizer)
            except (ValueError, NotImplementedError) as err:
                raise _Unavailable(str(err)) from err
            if parsed.error:
                raise _Failed(f"{emulation.origin}: {parsed.error}", tuple(boundaries))
        else:
            parsed = fmt.raw_parse(completion.parser_text)
        spec_ids = [c.call_id for c in turn.assistant.tool_calls]
        call_ids = [c.id or (spec_ids[i] if i < len(spec_ids) and spec_ids[i] else f"call_{calls_so_far + i}")
                    for i, c in enumerate(parsed.tool_calls)]
        call_cursor = 0
        calls_so_far += len(parsed.tool_calls)
        history.append(client_message(parsed, call_ids, **scenario.client))
        pending = (prompt, prompt_ids, completion, completion_ids, parsed, len(history) - 1)
    return tuple(boundaries)


def _close_boundary(model, engine, history, pending, render, index, trigger) -> Boundary:
    prompt, prompt_ids, completion, completion_ids, parsed, assistant_index = pending
    prev_text = prompt.text + completion.text
    prev_ids = prompt_ids + completion_ids if prompt_ids is not None and completion_ids is not None else None
    next_prompt, request_edits = render(history, True)
    if engine == "bridge":
        next_prompt = _bridge_prompt(model, prompt, completion, next_prompt, assistant_index)
        next_ids = _bridge_ids(model, prev_ids, next_prompt.text[len(prev_text):])
    else:
        next_ids = _ids(model, next_prompt.text)
    string_check = PrefixCheck(len(prev_text), common_prefix(prev_text, next_prompt.text))
    token_check = None
    if prev_ids is not None and next_ids is not None:
        token_check = PrefixCheck(len(prev_ids), common_prefix(prev_ids, next_ids))
    return Boundary(index, trigger, prompt, completion, completion_ids, prompt_ids, parsed, request_edits,
                    next_prompt, next_ids, string_check, token_check)


def _bridge_prompt(model: LoadedModel, prompt: Rendered, completion: Completion, rendered_next: Rendered,
                   assistant_index: int) -> Rendered:
    """Append-only next prompt, as renderers' bridge_to_next_turn: keep prompt + completion byte for byte,
    synthesise the turn close after a truncation, then only what the template renders for the new messages."""
    text = rendered_next.text
    idx = rendered_next.message_index
    # First character of a later message, and the assistant message's first and last characters: C-speed
    # tuple.index per distinct message instead of a Python loop over every character.
    new_start = min((idx.index(m) for m in set(idx) if m > assistant_index), default=len(text))
    stop = model.spec.stop_tokens[0] if model.spec.stop_tokens else ""
    close = ""
    if assistant_index in idx:
        first, last = idx.index(assistant_index), len(idx) - 1 - idx[::-1].index(assistant_index)
        span = text[first:last + 1]
        stop_at = span.rfind(completion.stop_token or stop) if (completion.stop_token or stop) else -1
        if stop_at >= 0:
            close = span[stop_at + len(completion.stop_token or stop):]
    if completion.truncated:
        close = stop + close
    appended = close + text[new_start:]

    def provenance() -> Provenance:
        # Only the next render's provenance is needed to build the text; the previous prompt's waits for a reader.
        return (prompt.message_index + (assistant_index,) * len(completion.text)
                + (assistant_index,) * len(close) + idx[new_start:],
                prompt.source_line + (0,) * (len(completion.text) + len(close))
                + rendered_next.source_line[new_start:])

    return Rendered(
        text=prompt.text + completion.text + appended,
        source_path=rendered_next.source_path,
        origin=f"bridge over {rendered_next.origin}",
        provenance=provenance,
    )


def _bridge_ids(model: LoadedModel, prev_ids: tuple[int, ...] | None, appended: str) -> tuple[int, ...] | None:
    if prev_ids is None or model.tokenizer is None:
        return None
    return prev_ids + token_ids(model.tokenizer, appended)
