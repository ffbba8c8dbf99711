"""Engine parser emulations, keyed "engine@version" (e.g. "vllm@0.33.0"); a bare engine name means its newest version.

Each engine version is one package (vllm_0_33_0, sglang_0_5_23, sglang_0_5_12) with one module per model family.
"""

from __future__ import annotations

from engine.parsers.base import EngineEmulation, RequestPrep
from engine.parsers.sglang_0_5_12 import Sglang0512Emulation
from engine.parsers.sglang_0_5_23 import SglangEmulation
from engine.parsers.vllm_0_33_0 import VllmEmulation

__all__ = ["EngineEmulation", "RequestPrep", "get_engine", "list_engines"]

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
