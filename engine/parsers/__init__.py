"""Engine parser emulations, keyed "engine@version" (e.g. "vllm@0.33.0"); a bare engine name means its newest version.

Each engine version is one package (vllm_0_33_0, sglang_0_5_23, sglang_0_5_12) with one module per model family.
Every other release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1) resolves to the real-engine backend
(engine/serving/real): that release's own code in a sandboxed worker; `real:vllm@0.33.0` asks for it for a pinned one.
A parser pair other than the model's own is named after the release by the engine's CLI names:
`vllm@0.31.0/qwen3+hermes` (`-` for none: `sglang@0.5.15/-+llama3`).
"""

from __future__ import annotations

import functools

from engine.parsers.base import EngineEmulation, RequestPrep
from engine.parsers.sglang_0_5_12 import Sglang0512Emulation
from engine.parsers.sglang_0_5_23 import SglangEmulation
from engine.parsers.vllm_0_33_0 import VllmEmulation

__all__ = ["EngineEmulation", "RequestPrep", "engine_versions", "get_engine", "known_engine", "list_engines"]

_ENGINES: dict[str, type[EngineEmulation]] = {
    "vllm@0.33.0": VllmEmulation,
    "sglang@0.5.23": SglangEmulation,
    "sglang@0.5.12": Sglang0512Emulation,
}
_NEWEST = {"vllm": "vllm@0.33.0", "sglang": "sglang@0.5.23"}


def list_engines() -> list[str]:
    return list(_ENGINES)


@functools.lru_cache(maxsize=4)
def engine_versions(name: str) -> tuple[str, ...]:
    """The versions a user can pick for `name`: the pinned (emulated) ones first, newest first, then every other
    release on PyPI, newest first, from the cached release index (PyPI is asked, for 5 s at most, only when there is
    none; without network the pinned ones are all). Answered once per process."""
    from engine.serving.real import fetch

    pinned = sorted((s.split("@")[1] for s in _ENGINES if s.startswith(name + "@")), key=fetch.Version, reverse=True)
    try:
        listed = fetch.list_releases(name, offline=True) or fetch.list_releases(name, timeout_s=5)
    except fetch.FetchError:
        listed = []
    return tuple(pinned + [r.version for r in reversed(listed) if r.version not in pinned])


def get_engine(spec: str) -> EngineEmulation:
    release, _, pair = spec.partition("/")
    if pair:
        reasoning, plus, tool = pair.partition("+")
        if not plus:
            raise ValueError(f"engine {spec!r}: name the parser pair as RELEASE/REASONING+TOOL (- for none)")
        engine = get_engine(release)
        override = {"reasoning_parser": None if reasoning in ("", "-") else reasoning,
                    "tool_call_parser": None if tool in ("", "-") else tool}
        engine._check_names(override["reasoning_parser"], override["tool_call_parser"])
        engine.parser_override = override
        return engine
    key = _NEWEST.get(spec, spec)
    if key in _ENGINES:
        return _ENGINES[key]()
    real = key.removeprefix("real:")
    name, _, version = real.partition("@")
    if name in _NEWEST and version:
        from engine.serving.real.backend import RealEngine, release_problem

        problem = release_problem(name, version)
        if problem is None:
            return RealEngine(name, version)
        raise ValueError(f"unknown engine {spec!r}: {problem}")
    raise ValueError(f"unknown engine {spec!r}; known: {', '.join([*_ENGINES, *_NEWEST])}, or any vllm@X / sglang@X "
                     "release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1)")


def known_engine(spec: object) -> str:
    """An engine argument from outside (the CLI, a link, evidence) checked against the engines there are: raw,
    bridge, renderers, an emulation or one of its versions, a vLLM / SGLang release on PyPI (with a parser pair);
    ExplorerError in one sentence otherwise."""
    from engine.errors import ExplorerError

    if spec in ("raw", "bridge", "renderers") or (isinstance(spec, str) and _NEWEST.get(spec, spec) in _ENGINES):
        return str(spec)
    if isinstance(spec, str) and spec.startswith("renderers@") and len(spec) <= 60:  # a version: the cell says if not
        return str(spec)
    if isinstance(spec, str) and len(spec) <= 200:
        # A release (vllm@0.31.0, real:vllm@0.33.0) or a parser pair (vllm/qwen3+hermes): get_engine says if it is one.
        release = spec.partition("/")[0].removeprefix("real:")
        if release.partition("@")[0] in _NEWEST and ("@" in release or "/" in spec):
            try:
                get_engine(spec)
                return spec
            except ValueError as err:
                raise ExplorerError(str(err)) from None
    shown = repr(spec)[:60] if isinstance(spec, str) else f"of type {type(spec).__name__}"
    raise ExplorerError(f"unknown engine {shown}; known: raw, bridge, renderers, {', '.join(sorted(_NEWEST))} or one "
                        f"of their versions ({', '.join(_ENGINES)}), or any vllm@X / sglang@X release on PyPI")
