"""Permissive stand-ins for the serving infrastructure around the parsers (engine client, model registry, logger …),
used inside the worker to build each release's own OpenAIServingChat through its real constructor.

A `Permissive` answers every attribute and call with another Permissive that is falsy, empty and equal to nothing,
so the serving code takes its "feature off" branches; what the parse depends on is set explicitly.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any


class Permissive:
    def __init__(self, name: str = "fake", **attributes: Any) -> None:
        object.__setattr__(self, "_name", name)
        for key, value in attributes.items():
            object.__setattr__(self, key, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Permissive(f"{self._name}.{name}")
        object.__setattr__(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Permissive:
        return Permissive(f"{self._name}()")

    def __bool__(self) -> bool:
        return False

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __await__(self):
        if False:
            yield
        return None

    def __repr__(self) -> str:
        return f"<fake {self._name}>"


def call_with(function: Any, known: dict[str, Any], *args: Any) -> Any:
    """Call `function` with the keyword arguments its signature names: known values first, then its own
    defaults, a Permissive for anything else required (constructors change arguments between releases)."""
    signature = inspect.signature(function)
    kwargs: dict[str, Any] = {}
    positional = list(args)
    for name, parameter in signature.parameters.items():
        if name in ("self", "cls") or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if positional:
            positional.pop(0)
            continue
        if name in known:
            kwargs[name] = known[name]
        elif parameter.default is parameter.empty:
            kwargs[name] = Permissive(name)
    return function(*args, **kwargs)


class HfConfig:
    """A model's config.json as the serving code reads it: a model type, no architectures, every other key None."""

    def __init__(self, model_type: str) -> None:
        self.model_type = model_type
        self.architectures = [model_type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def to_dict(self) -> dict:
        return {"model_type": self.model_type}


def streamed_message(events: list[str]) -> dict:
    """The message a client assembles from a chat-completion stream's server-sent events: reasoning and content
    deltas concatenated (None when none came), tool-call deltas merged by index, or the stream's error."""
    import json

    reasoning, content, calls = "", "", {}
    for event in events:
        for line in str(event).splitlines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            payload = json.loads(line[len("data: "):])
            if "error" in payload:
                error = payload["error"]
                return {"error": str(error.get("message", error) if isinstance(error, dict) else error)}
            for choice in payload.get("choices", []):
                delta = choice.get("delta") or {}
                reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    entry = calls.setdefault(call.get("index", 0), {"id": None, "name": "", "arguments": ""})
                    if call.get("id") and entry["id"] is None:
                        entry["id"] = call["id"]
                    function = call.get("function") or {}
                    entry["name"] += function.get("name") or ""
                    entry["arguments"] += function.get("arguments") or ""
    return {"reasoning": reasoning or None, "content": content or None,
            "tool_calls": [calls[i] for i in sorted(calls)], "error": None}


@functools.lru_cache(maxsize=64)
def source_entry(function: Any, root: Path) -> str:
    """file:line of the release's function a request went through (what a cell cites), relative to the release's
    root. Read from the source once per function: it is asked for every request."""
    line = inspect.getsourcelines(function)[1]
    return f"{Path(inspect.getsourcefile(function) or '').relative_to(root)}:{line}"
