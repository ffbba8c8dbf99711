"""Permissive stand-ins for the serving infrastructure around the parsers (engine client, model registry, logger …),
used inside the worker to build each release's own OpenAIServingChat through its real constructor.

A `Permissive` answers every attribute and call with another Permissive that is falsy, empty and equal to nothing,
so the serving code takes its "feature off" branches; what the parse depends on is set explicitly.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
from collections.abc import Coroutine
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
    kwargs: dict[str, Any] = {}
    positional = len(args)
    for name, required in parameters_of(function):
        if positional:
            positional -= 1
            continue
        if name in known:
            kwargs[name] = known[name]
        elif required:
            kwargs[name] = Permissive(name)
    return function(*args, **kwargs)


def parameters_of(function: Any) -> tuple[tuple[str, bool], ...]:
    """The parameters `call_with` fills (not self or cls, not *args or **kwargs), each with whether it is required.
    Read once per function: a signature does not change, and reading one is some fifty Python calls, each an event
    the line tracer is called for when a traced parse's glue reads it."""
    # A bound method is made anew at each attribute access: its function is the key (its signature drops the first
    # parameter whatever the instance).
    key = (function.__func__, "bound") if isinstance(function, types.MethodType) else function
    try:
        return _PARAMETERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: read each time
        return _read_parameters(function)
    found = _PARAMETERS[key] = _read_parameters(function)
    return found


def _read_parameters(function: Any) -> tuple[tuple[str, bool], ...]:
    return tuple((name, parameter.default is parameter.empty)
                 for name, parameter in inspect.signature(function).parameters.items()
                 if name not in ("self", "cls") and parameter.kind not in (parameter.VAR_POSITIONAL,
                                                                            parameter.VAR_KEYWORD))


_PARAMETERS: dict[Any, tuple[tuple[str, bool], ...]] = {}  # the worker's functions: a few dozen


def run_on(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any]) -> Any:
    """`asyncio.run(coroutine)` on the worker's one loop, kept between jobs (making and closing a loop is some 270
    Python calls, each an event for the line tracer in a traced parse). What asyncio.run does after the coroutine is
    done is done here too: the tasks it left are cancelled. The async generators left open are the glue's own (the
    outputs it feeds the release), closed when collected; the release's streams are read to their end."""
    try:
        return loop.run_until_complete(coroutine)
    finally:
        left = asyncio.all_tasks(loop)
        if left:
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


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
