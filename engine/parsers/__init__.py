"""Engine parser emulations, keyed "engine@version" (e.g. "vllm@0.33.0"); a bare engine name means its newest version.

Each engine version is one package (vllm_0_33_0, sglang_0_5_23, sglang_0_5_12) with one module per model family.
Every other release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1) resolves to the real-engine backend
(engine/serving/real): that release's own code in a sandboxed worker; `real:vllm@0.33.0` asks for it for a pinned one.
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
    if key in _ENGINES:
        return _ENGINES[key]()
    real = key.removeprefix("real:")
    name, _, version = real.partition("@")
    if name in _NEWEST and version:
        from engine.serving.real.backend import RealEngine, is_release

        if is_release(name, version):
            return RealEngine(name, version)
    raise ValueError(f"unknown engine {spec!r}; known: {', '.join([*_ENGINES, *_NEWEST])}, or any vllm@X / sglang@X "
                     "release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1)")
