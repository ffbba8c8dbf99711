"""Errors a user can act on: each names the model, the file and the cause in one sentence."""

from __future__ import annotations


class ExplorerError(Exception):
    """Base class; `str(err)` is the one sentence shown to the user."""


class AssetError(ExplorerError):
    """A model asset is missing, corrupt or of the wrong version."""


class RenderError(ExplorerError):
    """The template (or encoder) refused or failed to render a conversation.

    `source_line` is the template line that raised, when known (e.g. a `raise_exception` call).
    """

    def __init__(self, message: str, *, model: str = "", path: str = "", source_line: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.path = path
        self.source_line = source_line


class EngineSpecError(ExplorerError, ValueError):
    """An engine name that names no engine column (engine.serving.spec.EngineSpec.parse); a ValueError too, as the
    registry's refusals of a release are."""


class UnknownEngineKind(EngineSpecError):
    """An engine name whose engine is none of raw, bridge, renderers, vllm, sglang (the registry lists the rest)."""


class TokenizerUnavailable(ExplorerError):
    """The model has no tokenizer here; string-level results still work."""


def is_panic(err: BaseException) -> bool:
    """A Rust panic surfaced by pyo3 (`pyo3_runtime.PanicException`, e.g. from tiktoken or tokenizers). It derives
    from BaseException, so `except Exception` misses it; each extension defines its own class, hence the name test."""
    return type(err).__name__ == "PanicException"
