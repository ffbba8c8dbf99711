"""Engine parser emulations, keyed "engine@version" (e.g. "vllm@0.33.0"); a bare engine name means its newest version.

Each engine version is one package (vllm_0_33_0, sglang_0_5_23, sglang_0_5_12) with one module per model family.
"""

from __future__ import annotations

from engine.parsers.base import EngineEmulation, RequestPrep
from engine.parsers.sglang_0_5_12 import Sglang0512Emulation
from engine.parsers.sglang_0_5_23 import SglangEmulation
from engine.parsers.vllm_0_33_0 import VllmEmulation

__all__ = ["EngineEmulation", "RequestPrep", "get_engine", "known_engine", "list_engines"]

_ENGINES: dict[str, type[EngineEmulation]] = {
    "vllm@0.33.0": VllmEmulation,
    "sglang@0.5.23": SglangEmulation,
    "sglang@0.5.12": Sglang0512Emulation,
}
_NEWEST = {"vllm": "vllm@0.33.0", "sglang": "sglang@0.5.23"}


def list_engines() -> list[str]:
    return list(_ENGINES)


def get_engine(spec: str) -> EngineEmulation:
    key = _NEWEST.get(spec, spec)
    if key not in _ENGINES:
        raise ValueError(f"unknown engine {spec!r}; known: {', '.join([*_ENGINES, *_NEWEST])}")
    return _ENGINES[key]()


def known_engine(spec: object) -> str:
    """An engine argument from outside (the CLI, a link, evidence) checked against the engines there are: raw,
    bridge, an emulation or one of its versions; ExplorerError in one sentence otherwise."""
    from engine.errors import ExplorerError

    if spec in ("raw", "bridge") or (isinstance(spec, str) and _NEWEST.get(spec, spec) in _ENGINES):
        return str(spec)
    shown = repr(spec)[:60] if isinstance(spec, str) else f"of type {type(spec).__name__}"
    raise ExplorerError(f"unknown engine {shown}; known: raw, bridge, {', '.join(sorted(_NEWEST))} or one of their "
                        f"versions ({', '.join(_ENGINES)})")
