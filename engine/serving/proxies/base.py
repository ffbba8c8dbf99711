"""What a proxy or client profile is to a column (engine.serving.layers): the Proxy protocol, what it forwards, and
the field-by-field edits it made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import ExplorerError
from engine.types import Edit, Location


class LayerUnavailable(ExplorerError):
    """A layer cannot run for this cell (no template for the runtime, no Node, a proxy that cannot load); one
    sentence."""


@dataclass(frozen=True)
class Forwarded:
    """What a proxy passes on: the messages and tools, and what it changed (in the request or the response)."""

    messages: list[dict]
    tools: list[dict] | None
    edits: tuple[Edit, ...] = ()


class Proxy(Protocol):
    name: str  # as the column names it: litellm, litellm@1.104.9, langchain-openai

    @property
    def origin(self) -> str:
        """Whose code an edit of this proxy is: "litellm 1.110.2", "profile langchain-openai"
        (proxy_origin)."""

    @property
    def label(self) -> str:
        """What the cell says it passed: "LiteLLM 1.110.2 hosted_vllm (proxy)"."""

    def request(self, messages: list[dict], tools: list[dict] | None) -> Forwarded:
        """The client's request as this proxy forwards it to the next hop."""

    def response(self, message: dict) -> tuple[dict, tuple[Edit, ...]]:
        """The reply message (OpenAI JSON) as this proxy hands it back toward the client."""


def message_edits(origin: str, where: Location, sent: list[dict], forwarded: list[dict], *,
                  direction: str = "request") -> tuple[Edit, ...]:
    """What a layer changed in the messages, field by field (a field dropped, renamed, or given another value)."""
    edits: list[Edit] = []
    if len(sent) != len(forwarded):
        return (Edit(f"{direction}_messages", f"{len(sent)} messages", f"{len(forwarded)} messages", where,
                     f"{origin} forwards {len(forwarded)} of the {len(sent)} messages"),)
    for index, (before, after) in enumerate(zip(sent, forwarded)):
        prefix = f"messages[{index}]" if direction == "request" else "message"
        for key, value in before.items():
            if key in after and after[key] == value:
                continue
            if key in after:
                edits.append(Edit(f"{key}_changed", f"{prefix}.{key}={_shown(value)}",
                                  f"{prefix}.{key}={_shown(after[key])}", where,
                                  f"{origin} changes the {key} of {prefix}"))
                continue
            renamed = [k for k in after if k not in before and after[k] == value and value is not None]
            edits.append(Edit(f"{key}_renamed" if renamed else f"{key}_dropped", f"{prefix}.{key}",
                              " + ".join(f"{prefix}.{k}" for k in renamed), where,
                              f"{origin} forwards {prefix}.{key} as {', '.join(renamed)}" if renamed else
                              f"{origin} drops {prefix}.{key}"))
        for key in after:
            if key not in before and not any(e.after.endswith(f".{key}") for e in edits):
                edits.append(Edit(f"{key}_added", f"{prefix}", f"{prefix}.{key}={_shown(after[key])}", where,
                                  f"{origin} adds {key} to {prefix}"))
    return tuple(edits)


def _shown(value: Any) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:79] + "…"


def proxy_origin(name: str) -> str:
    """The origin of the edits of the proxy a column names: `litellm` and `litellm@1.104.9` -> "litellm" and
    "litellm 1.104.9" (a prefix: the pinned release's origin names its version); a profile -> "profile NAME"."""
    base, _, version = name.partition("@")
    if base == "litellm":
        return f"litellm {version}" if version else "litellm "
    return f"profile {name}"
