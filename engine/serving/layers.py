"""The layers of one column between the model and the cache (issue 27): what an EngineSpec's runtime, proxies and
server flags put around the engine, built once per cell.

    client ─▶ proxy … proxy ─▶ engine's request side ─▶ template runtime ─▶ prompt ─▶ cache
    client ◀─ proxy … proxy ◀─ engine's parsers ◀────────────────────────── completion

- The template runtime renders the model's Jinja template instead of transformers' Jinja
  (engine.render.runtimes.RuntimeRenderer); a model rendered by other code (an encoder, openai-harmony) has no
  template to hand it, and such a column is `unavailable` with the sentence why.
- A proxy rewrites the history the client sends (the request) and the engine's reply the client gets (the response):
  LiteLLM's own code (engine.serving.proxies.litellm) or a declarative client profile
  (engine.serving.proxies.profiles). Each rewrite is recorded as an Edit naming the proxy's code.
- A server flag is handed to the release's real code (the column runs it: engine.serving.registry.get_engine).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.serving.proxies.base import Forwarded, LayerUnavailable, Proxy
from engine.serving.spec import EngineSpec
from engine.types import Edit, ParseResult, ToolCall

if TYPE_CHECKING:
    from engine.models import LoadedModel
    from engine.serving.base import EngineEmulation


def response_message(parsed: ParseResult, reasoning_fields: tuple[str, ...]) -> dict:
    """The engine's reply as the JSON message its server writes: `reasoning_fields` name the reasoning as that
    release's ChatMessage serialises it (reply_reasoning_fields)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        for name in reasoning_fields:
            message[name] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                            "arguments": c.arguments}}
                                 for c in parsed.tool_calls]
    return message


def received(message: dict, parsed: ParseResult) -> ParseResult:
    """What an OpenAI-style client reads off a reply message: content, the reasoning (reasoning_content, else
    reasoning) and the calls; the engine's edits stay with the engine's result."""
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    calls = tuple(ToolCall(c.get("id"), (c.get("function") or {}).get("name", ""),
                           (c.get("function") or {}).get("arguments", "")) for c in message.get("tool_calls") or ())
    return dataclasses.replace(parsed, reasoning=reasoning, content=message.get("content"), tool_calls=calls)


def reply_reasoning_fields(engine: EngineEmulation | None) -> tuple[str, ...]:
    """The reasoning field(s) a release's reply carries: vLLM's ChatMessage has `reasoning_content` before 0.13,
    both from 0.13 to 0.15 (`reasoning_content` deprecated) and `reasoning` only from 0.16
    (vllm/entrypoints/openai/protocol.py ChatMessage; 0.33.0: chat_completion/protocol.py:86); SGLang's has
    `reasoning_content` (sglang/srt/entrypoints/openai/protocol.py ChatMessage). Raw: `reasoning_content`."""
    if engine is None or engine.name != "vllm":
        return ("reasoning_content",)
    from engine.serving.real.fetch import Version

    release = Version(engine.version)
    if release < Version("0.13.0"):
        return ("reasoning_content",)
    return ("reasoning", "reasoning_content") if release < Version("0.16.0") else ("reasoning",)


@dataclass(frozen=True)
class ColumnLayers:
    """A cell's layers: the model as its template runtime renders it, and the proxies, client side first."""

    model: LoadedModel
    proxies: tuple[Proxy, ...]
    passed: tuple[str, ...]  # what the cell says it passed, client side first

    def request(self, messages: list[dict], tools: list[dict] | None) -> Forwarded:
        edits: list[Edit] = []
        for proxy in self.proxies:
            forwarded = proxy.request(messages, tools)
            messages, tools = forwarded.messages, forwarded.tools
            edits += forwarded.edits
        return Forwarded(messages, tools, tuple(edits))

    def response(self, parsed: ParseResult, engine: EngineEmulation | None) -> tuple[ParseResult, tuple[Edit, ...]]:
        message = response_message(parsed, reply_reasoning_fields(engine))
        edits: list[Edit] = []
        for proxy in reversed(self.proxies):
            message, changed = proxy.response(message)
            edits += changed
        return received(message, parsed), tuple(edits)


def base_model(model: LoadedModel) -> LoadedModel:
    """`model` without a template runtime's renderer (the model it was made from)."""
    return getattr(model.renderer, "base_model", None) or model


def with_runtime(model: LoadedModel, name: str) -> LoadedModel:
    """`model` rendered by the template runtime `name` (the same object for the stock model: renders are cached)."""
    from engine.models import load_model

    if model is load_model(model.id):
        return _stock_with_runtime(model.id, name)
    return _build_with_runtime(model, name)


@functools.lru_cache(maxsize=64)
def _stock_with_runtime(model_id: str, name: str) -> LoadedModel:
    from engine.models import load_model

    return _build_with_runtime(load_model(model_id), name)


def _build_with_runtime(model: LoadedModel, name: str) -> LoadedModel:
    from engine.render.cache import CachedRenderer
    from engine.render.runtimes import RuntimeRenderer, RuntimeUnavailable, runtime
    from engine.sandbox import SandboxedRenderer

    if isinstance(getattr(model.renderer, "inner", model.renderer), SandboxedRenderer):
        raise LayerUnavailable(f"{model.id}'s template {model.renderer.source_path} is an upload, rendered only in the "
                               f"sandbox: {name} renders the stock models' templates")
    source = getattr(model.renderer, "template_source", None)
    if not isinstance(source, str):
        raise LayerUnavailable(f"{model.id} is rendered by {model.renderer.source_path}, not a Jinja template: there "
                               f"is no template for {name} to render")
    try:
        engine = runtime(name)
    except RuntimeUnavailable as err:
        raise LayerUnavailable(str(err)) from None
    renderer = RuntimeRenderer(model.renderer, engine)
    renderer.base_model = model  # type: ignore[attr-defined]  # base_model() reads it back
    return dataclasses.replace(model, renderer=CachedRenderer(renderer),
                               asset_hashes={**model.asset_hashes, engine.name: engine.version})


def column_layers(model: LoadedModel, spec: EngineSpec, engine: EngineEmulation | None) -> ColumnLayers:
    """The layers `spec` names around `engine` for `model` (as that engine renders it); LayerUnavailable in one
    sentence when one cannot run here."""
    from engine.serving.proxies import proxy

    passed: list[str] = []
    proxies = tuple(proxy(name, model.spec.hub_repo or model.id) for name in spec.proxies)
    passed += [p.label for p in proxies]
    if engine is not None:
        flags = ", ".join(f"--{flag}" for flag in spec.flags)
        passed.append(f"{engine.name} {engine.version}" + (f" with {flags}" if flags else ""))
    if spec.runtime is not None:
        if model.served_from is not None:
            raise LayerUnavailable(f"{model.served_by} renders {model.id} with {model.renderer.source_path}, not its "
                                   f"Jinja template: there is no template for {spec.runtime} to render")
        model = with_runtime(model, spec.runtime)
        passed.append(f"{model.renderer.inner.runtime.label} (template runtime)")
    return ColumnLayers(model, proxies, tuple(passed))
