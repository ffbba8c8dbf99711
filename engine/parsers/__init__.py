"""Engine parser emulations, keyed "engine@version" (e.g. "vllm@0.33.0"); a bare engine name means its newest version.

Each engine version is one package (vllm_0_33_0, sglang_0_5_23, sglang_0_5_12) with one module per model family.
Every other release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1) resolves to the real-engine backend
(engine/serving/real): that release's own code in a sandboxed worker; `real:vllm@0.33.0` asks for it for a pinned one.
A parser pair other than the model's own is named after the release by the engine's CLI names:
`vllm@0.31.0/qwen3+hermes` (`-` for none: `sglang@0.5.15/-+llama3`).
A pinned release asked for a parser its emulation does not have (a model family without an emulation: `hermes`,
`deepseek_v31`, …) runs that release's real code instead (`real_twin`): the same release, never another one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from engine.parsers.base import EngineEmulation, RequestPrep
from engine.parsers.sglang_0_5_12 import Sglang0512Emulation
from engine.parsers.sglang_0_5_23 import SglangEmulation
from engine.parsers.vllm_0_33_0 import VllmEmulation
from engine.types import ParseResult

__all__ = ["EngineEmulation", "RequestPrep", "engine_versions", "for_parsers", "get_engine", "known_engine",
           "list_engines", "parse_served", "real_twin", "Serving", "serving_engine"]

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


def _shown(spec: str, size: int = 80) -> str:
    """An engine argument as an error shows it: repr, cut to `size` characters (a name may be any length)."""
    return repr(spec if len(spec) <= size else spec[: size - 1] + "…")


def get_engine(spec: str) -> EngineEmulation:
    release, _, pair = spec.partition("/")
    if pair:
        reasoning, plus, tool = pair.partition("+")
        if not plus:
            raise ValueError(f"engine {_shown(spec)}: name the parser pair as RELEASE/REASONING+TOOL (- for none)")
        override = {"reasoning_parser": None if reasoning in ("", "-") else reasoning,
                    "tool_call_parser": None if tool in ("", "-") else tool}
        engine = for_parsers(get_engine(release), override["reasoning_parser"], override["tool_call_parser"])
        engine.check_names(override["reasoning_parser"], override["tool_call_parser"])
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
        raise ValueError(f"unknown engine {_shown(spec)}: {problem}")
    raise ValueError(f"unknown engine {_shown(spec)}; known: {', '.join([*_ENGINES, *_NEWEST])}, or any vllm@X / "
                     "sglang@X release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1)")


def real_twin(engine: EngineEmulation) -> EngineEmulation:
    """The real code of `engine`'s own release (vllm@0.33.0 -> real:vllm@0.33.0), with the same parser pair."""
    from engine.serving.real.backend import RealEngine

    twin = RealEngine(engine.name, engine.version)
    twin.parser_override = engine.parser_override
    return twin


def for_parsers(engine: EngineEmulation, reasoning_parser: str | None, tool_parser: str | None) -> EngineEmulation:
    """`engine` when it emulates this pair of CLI names; otherwise its release's real code, which has every parser
    the release ships (and says so in one sentence when it lacks one too)."""
    if engine.reads_tokenizer or engine.emulates(reasoning_parser, tool_parser):  # the real code, or emulated
        return engine
    return real_twin(engine)


@dataclass(frozen=True)
class Serving:
    """What serves a model on an engine column: the engine that runs its parser pair, and the pair."""

    engine: EngineEmulation
    parsers: dict[str, str]
    pinned: bool  # the column asked for is a pinned emulation (where its release's real code runs, it stands in)


def serving_engine(spec: str, engine_parsers: dict[str, dict[str, str]]) -> Serving:
    """What serves a model on the engine `spec` names: its parser pair (the one `spec` names, else the model's
    manifest's for that engine) and the engine that runs the pair (for_parsers). ValueError for an unknown engine."""
    asked = get_engine(spec)
    parsers = asked.parser_override or engine_parsers.get(asked.name, {})
    engine = for_parsers(asked, parsers.get("reasoning_parser"), parsers.get("tool_call_parser"))
    return Serving(engine, parsers, not asked.reads_tokenizer)


def parse_served(engine: EngineEmulation, text: str, request: dict[str, Any],
                 real_options: dict[str, Any] | None = None) -> tuple[EngineEmulation, ParseResult]:
    """`engine.parse(text, **request)`, and the engine that parsed: a pinned emulation that has the names but does
    not emulate the pair (NotImplementedError: DeepSeek V3.1's deepseek_v31) hands it to its release's real code,
    which then serves the rest of the conversation. `real_options` go to the real backend only (force_reasoning,
    trace)."""
    def parse(serving: EngineEmulation) -> ParseResult:
        return serving.parse(text, **request, **(real_options or {} if serving.reads_tokenizer else {}))

    try:
        return engine, parse(engine)
    except NotImplementedError:
        if engine.reads_tokenizer:
            raise
        twin = real_twin(engine)
        return twin, parse(twin)


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
