"""The proxies and client profiles a column can put between the client and the engine (`vllm+litellm`,
`raw+langchain-openai`): LiteLLM's own code (litellm.py) and declarative profiles (profiles.py, data in
proxy_profiles/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.serving.proxies.base import Proxy


def proxy(name: str, model_name: str = "model") -> Proxy:
    """The proxy a column names: `litellm` (the pinned release), `litellm@VERSION`, or a profile's name;
    LayerUnavailable in one sentence for any other. `model_name`: the model as the client names it (LiteLLM's
    `hosted_vllm/<model_name>`)."""
    base, _, version = name.partition("@")
    if base == "litellm":
        from engine.serving.proxies.litellm import LiteLLMProxy

        return LiteLLMProxy(version or None, model_name)
    from engine.serving.proxies.profiles import profile

    return profile(name)


def known_proxies() -> list[str]:
    """Every proxy name a column can use without a version."""
    from engine.serving.proxies.profiles import profile_names

    return ["litellm", *profile_names()]
