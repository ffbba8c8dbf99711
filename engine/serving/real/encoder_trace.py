"""Inside the worker only: an engine's bundled DeepSeek V4 encoder as its serving code calls it, with provenance.

`recorded_calls` wraps the encoder function where the serving code looks it up, so each call's arguments are kept
while the call itself runs unchanged; `encoder_reply` returns the prompt and, when asked, the per-character
provenance of that same call, traced by engine.render.deepseek_v4 over the engine's own encoder module (the tracer
checks that its run gives the same prompt).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any


@contextlib.contextmanager
def recorded_calls(owner: Any, name: str) -> Iterator[list[dict]]:
    """Calls of `owner.<name>` while the block runs: {"messages": [...], **keyword arguments}."""
    real = getattr(owner, name)
    calls: list[dict] = []

    def recording(messages: list, *args: Any, **kwargs: Any) -> Any:
        calls.append({"messages": copy.deepcopy(messages), "args": list(args), **copy.deepcopy(kwargs)})
        return real(messages, *args, **kwargs)

    setattr(owner, name, recording)
    try:
        yield calls
    finally:
        setattr(owner, name, real)


def encoder_reply(prompt: str, calls: list[dict], encoder: ModuleType, root: Path, job: dict) -> dict:
    """The prompt; with `provenance`, which message and encoder line produced each character; with
    `counterfactual` ({undo_from, undo, substitute}), the prompt the same call gives with those encoder constructs
    undone, and the constructs' evaluations (engine.render.constructs; the ids are those of the encoder's source)."""
    reply: dict[str, Any] = {"prompt": prompt, "encoder_path": str(Path(encoder.__file__).relative_to(root))}
    if not job.get("provenance") and not job.get("counterfactual"):
        return reply
    if len(calls) != 1 or calls[0]["args"]:
        reply["provenance_error"] = f"the serving code called the encoder {len(calls)} times"
        return reply
    call = calls[0]
    messages = call["messages"]
    given = int(job.get("message_count") or 0)
    # The serving code may insert one system message in front (tools, or SGLang's empty system prompt).
    origin = list(range(len(messages))) if len(messages) == given else [-1, *range(len(messages) - 1)]
    request = {"messages": messages, "origin": origin, "thinking_mode": call.get("thinking_mode", "chat"),
               "drop_thinking": call.get("drop_thinking", True), "reasoning_effort": call.get("reasoning_effort")}
    if job.get("renderer") == "deepseek_v32":
        return _v32_reply(reply, prompt, request, encoder, job)
    renderer = _v4_renderer(encoder)
    if job.get("provenance"):
        index, lines = renderer._provenance_of(prompt, request)
        reply["provenance"] = {"message_index": list(index), "source_line": list(lines)}
    wanted = job.get("counterfactual")
    if wanted:
        owners = {number: next((o for o in group if o >= 0), -1)
                  for number, group in enumerate(renderer._render_origins(request))}
        module = renderer._instrumented()
        substitute = {int(k): v for k, v in (wanted.get("substitute") or {}).items()}
        text, evaluations = module.run(lambda: renderer._encode(request, module.namespace["encode_messages"]),
                                       owners, undo_from=wanted.get("undo_from"),
                                       undo=frozenset(wanted.get("undo") or ()), substitute=substitute)
        reply["counterfactual"] = {"prompt": text, "evaluations": [
            [e.construct, e.message, _jsonable(e.before), _jsonable(e.after)] for e in evaluations]}
    return reply


def _v32_reply(reply: dict, prompt: str, request: dict, encoder: ModuleType, job: dict) -> dict:
    """encoder_reply for DeepSeek V3.2's encoder (engine.render.deepseek_v32)."""
    traced = _v32_encoder(encoder)
    if job.get("provenance"):
        try:
            index, lines = traced.provenance(prompt, request)
            reply["provenance"] = {"message_index": index, "source_line": lines}
        except ValueError as err:
            reply["provenance_error"] = str(err)
    wanted = job.get("counterfactual")
    if wanted:
        substitute = {int(k): v for k, v in (wanted.get("substitute") or {}).items()}
        text, evaluations = traced.counterfactual(request, undo_from=wanted.get("undo_from"),
                                                  undo=frozenset(wanted.get("undo") or ()), substitute=substitute)
        reply["counterfactual"] = {"prompt": text, "evaluations": [
            [e.construct, e.message, _jsonable(e.before), _jsonable(e.after)] for e in evaluations]}
    return reply


@functools.lru_cache(maxsize=4)
def _v4_renderer(encoder: ModuleType) -> Any:
    # One per encoder module for the worker's life: its instrumented copy (the encoder's source rewritten, about
    # 150 ms) is built once, not per request.
    from engine.render.deepseek_v4 import DeepSeekV4Renderer

    return DeepSeekV4Renderer(encoder)


@functools.lru_cache(maxsize=4)
def _v32_encoder(encoder: ModuleType) -> Any:
    from engine.render.deepseek_v32 import DeepSeekV32Encoder

    return DeepSeekV32Encoder(encoder)


def _jsonable(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)
