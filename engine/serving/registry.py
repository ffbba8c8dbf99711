"""The engines by their own names: "engine@version" (e.g. "vllm@0.33.0") to the class that serves it, as SGLang's
`FunctionCallParser.ToolCallParserEnum` maps a CLI name to its class; a bare engine name means its newest version.

The releases the project pins (PINNED: what `list_engines`, `engine_versions` and blame's fix hints iterate) are not
the same list as the emulated ones (EMULATIONS: engine/serving/emulated, vllm_0_33_0 and sglang_0_5_23): a pinned
release without an emulation (sglang@0.5.12), or a family its emulation lacks, runs that release's own code. Every
other release on PyPI (vLLM from 0.10.0, SGLang from 0.5.1) resolves to the real-engine backend
(engine/serving/real): that release's own code in a sandboxed worker; `real:vllm@0.33.0` asks for it for a pinned one.
A parser pair other than the model's own is named after the release by the engine's CLI names:
`vllm@0.31.0/qwen3+hermes` (`-` for none: `sglang@0.5.15/-+llama3`).
A pinned release asked for a parser its emulation does not have (a model family without an emulation: `hermes`,
`deepseek_v31`, …) runs that release's real code instead (`real_twin`): the same release, never another one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import ExplorerError, UnknownEngineKind
from engine.serving.base import EngineEmulation
from engine.serving.emulated.sglang_0_5_23 import SglangEmulation
from engine.serving.emulated.vllm_0_33_0 import VllmEmulation
from engine.serving.real import fetch
from engine.serving.real.backend import RealEngine, release_problem, spawn_workers
from engine.serving.spec import EngineSpec
from engine.types import ParseResult

# The releases the project pins (golden files, default columns, fix hints), newest of each engine first.
PINNED = ("vllm@0.33.0", "sglang@0.5.23", "sglang@0.5.12")
# The pinned releases that have an emulation, by the name the engine gives them; the others run their real code.
EMULATIONS: dict[str, type[EngineEmulation]] = {
    "vllm@0.33.0": VllmEmulation,
    "sglang@0.5.23": SglangEmulation,
}
# What a bare engine name means.
NEWEST = {"vllm": "vllm@0.33.0", "sglang": "sglang@0.5.23"}


def list_engines() -> list[str]:
    return list(PINNED)


@functools.lru_cache(maxsize=4)
def engine_versions(name: str) -> tuple[str, ...]:
    """The versions a user can pick for `name`: the pinned ones first, newest first, then every other
    release on PyPI, newest first, from the cached release index (PyPI is asked, for 5 s at most, only when there is
    none; without network the pinned ones are all). Answered once per process."""
    releases = [EngineSpec.parse(release) for release in PINNED]
    pinned = sorted((r.version for r in releases if r.kind == name and r.version), key=fetch.Version, reverse=True)
    try:
        listed = fetch.list_releases(name, offline=True) or fetch.list_releases(name, timeout_s=5)
    except fetch.FetchError:
        listed = []
    return tuple(pinned + [r.version for r in reversed(listed) if r.version not in pinned])


def get_engine(spec: EngineSpec | str) -> EngineEmulation:
    """The engine object that serves `spec` (a vLLM or SGLang column); ValueError in one sentence for any other."""
    if isinstance(spec, str):
        spec = parse_engine(spec)
    if spec.runtime is not None or spec.proxies:  # the layers around the engine are the column's (serving.layers)
        problem = proxy_problem(spec)
        if problem is not None:
            raise ValueError(problem)
        return get_engine(replace(spec, runtime=None, proxies=()))
    if spec.flags:
        # A server flag is run through the release's own code, where it is implemented (its real twin for a pinned
        # release).
        engine = get_engine(replace(spec, flags=()))
        flagged = engine if engine.is_real_release else real_twin(engine)
        flagged.server_flags = {flag.name: flag.json_value() if flag.value is not None else True
                                for flag in spec.flags}
        return flagged
    if spec.parsers is not None:
        pair = spec.parsers
        engine = for_parsers(get_engine(replace(spec, parsers=None)), pair.reasoning_parser, pair.tool_call_parser)
        engine.check_names(pair.reasoning_parser, pair.tool_call_parser)
        engine.parser_override = pair.as_override()
        return engine
    key = NEWEST.get(spec.release, spec.release)
    if key in EMULATIONS and not spec.real_code:
        return EMULATIONS[key]()
    if spec.is_serving_engine and spec.version is not None:
        problem = release_problem(spec.kind, spec.version)
        if problem is None:
            return real_release(spec.kind, spec.version)
        raise ValueError(f"unknown engine {str(spec)!r}: {problem}")
    raise ValueError(_unknown_engine(repr(str(spec))))


def spawn_releases(specs: Iterable[EngineSpec | str], models_parsers: Iterable[dict[str, dict[str, str]]]
                   ) -> list[str]:
    """Start, without waiting, the workers of the releases these columns ask for models with these parser pairs (each
    model manifest's `engine_parsers`): a column's own release where it runs that release's code for a model's pair
    (`EngineEmulation.asks_release`), and each other pinned release of its engine where that one does (a fix hint
    re-runs a break on it). A column that names no engine, or an unknown one, starts nothing (its cells say why); nor
    does a column whose every model its emulation serves alone. The releases whose answers the result cache does not
    hold (backend.spawn_workers)."""
    pairs = list(models_parsers)
    releases: dict[tuple[str, str], None] = {}
    for spec in specs:
        try:
            column = parse_engine(spec) if isinstance(spec, str) else spec
            engine = get_engine(column)
        except (ValueError, ExplorerError):
            continue
        siblings = [other for pinned in PINNED if (other := EngineSpec.parse(pinned)).kind == engine.name
                    and other.version != engine.version]
        for candidate in (column, *siblings):
            for parsers in pairs:
                try:
                    serving = serving_engine(candidate, parsers)
                except (ValueError, ExplorerError):
                    continue
                pair = serving.parsers
                if serving.engine.asks_release(pair.get("reasoning_parser"), pair.get("tool_call_parser")):
                    releases[(serving.engine.name, serving.engine.version)] = None
                    break
    return spawn_workers(releases)


def parse_engine(text: str) -> EngineSpec:
    """EngineSpec.parse, with this registry's sentence (the releases it pins) for a name of no engine: ValueError."""
    try:
        return EngineSpec.parse(text)
    except UnknownEngineKind:
        raise ValueError(_unknown_engine(repr(text))) from None


def _unknown_engine(shown: str) -> str:
    return (f"unknown engine {shown}; known: {', '.join([*PINNED, *NEWEST])}, or any vllm@X / sglang@X release on "
            "PyPI (vLLM from 0.10.0, SGLang from 0.5.1)")


def real_release(name: str, version: str) -> RealEngine:
    """The real code of release `version` of engine `name`, with the newest emulation of that engine standing in for
    the request side where the release's own glue cannot drive it (the backend does not import the emulations: one of
    them runs the backend itself, sglang_0_5_23/deepseek_recipe.py)."""
    return RealEngine(name, version, stand_in=EMULATIONS[NEWEST[name]])


def real_twin(engine: EngineEmulation) -> EngineEmulation:
    """The real code of `engine`'s own release (vllm@0.33.0 -> real:vllm@0.33.0), with the same parser pair."""
    twin = real_release(engine.name, engine.version)
    twin.parser_override = engine.parser_override
    return twin


def for_parsers(engine: EngineEmulation, reasoning_parser: str | None, tool_parser: str | None) -> EngineEmulation:
    """`engine` when it emulates this pair of CLI names; otherwise its release's real code, which has every parser
    the release ships (and says so in one sentence when it lacks one too)."""
    if engine.is_real_release or engine.emulates(reasoning_parser, tool_parser):  # the real code, or emulated
        return engine
    return real_twin(engine)


@dataclass(frozen=True)
class Serving:
    """What serves a model on an engine column: the engine that runs its parser pair, and the pair."""

    engine: EngineEmulation
    parsers: dict[str, str]
    pinned: bool  # the column asked for is a pinned release, not its `real:` code (real code standing in is traced)


def serving_engine(spec: EngineSpec | str, engine_parsers: dict[str, dict[str, str]]) -> Serving:
    """What serves a model on the engine `spec` names: its parser pair (the one `spec` names, else the model's
    manifest's for that engine) and the engine that runs the pair (for_parsers). ValueError for an unknown engine."""
    if isinstance(spec, str):
        spec = parse_engine(spec)
    asked = get_engine(spec)
    parsers = asked.parser_override or engine_parsers.get(asked.name, {})
    engine = for_parsers(asked, parsers.get("reasoning_parser"), parsers.get("tool_call_parser"))
    return Serving(engine, parsers, not spec.real_code and asked.spec in PINNED)


def parse_served(engine: EngineEmulation, text: str, request: dict[str, Any],
                 real_options: dict[str, Any] | None = None) -> tuple[EngineEmulation, ParseResult]:
    """`engine.parse(text, **request)`, and the engine that parsed: a pinned emulation that has the names but does
    not emulate the pair (NotImplementedError: SGLang 0.5.23's deepseekv31) hands it to its release's real code,
    which then serves the rest of the conversation. `real_options` go to the real backend only (force_reasoning,
    trace)."""
    def parse(serving: EngineEmulation) -> ParseResult:
        return serving.parse(text, **request, **(real_options or {} if serving.is_real_release else {}))

    try:
        return engine, parse(engine)
    except NotImplementedError:
        if engine.is_real_release:
            raise
        twin = real_twin(engine)
        return twin, parse(twin)


def proxy_problem(spec: EngineSpec) -> str | None:
    """The sentence for a proxy the column names that is none (litellm, litellm@VERSION, a profile), else None."""
    if not spec.proxies:
        return None
    from engine.serving.proxies import known_proxies

    known = known_proxies()
    unknown = [name for name in spec.proxies if name.partition("@")[0] not in known or
               ("@" in name and name.partition("@")[0] != "litellm")]
    if not unknown:
        return None
    return (f"unknown layer {unknown[0][:40]!r} in engine {str(spec)[:80]!r}; known: a template runtime (minijinja, "
            f"hfjs) or a proxy ({', '.join(known)}; litellm@VERSION: another LiteLLM release); a release is named "
            "without a local version (+...)")


def known_engine(text: object) -> EngineSpec:
    """An engine argument from outside (the CLI, a link, evidence) parsed once and checked against the engines there
    are: raw, bridge, renderers, an emulation or one of its versions, a vLLM / SGLang release on PyPI (with a parser
    pair); ExplorerError in one sentence otherwise."""
    try:
        spec = EngineSpec.parse(text)
    except UnknownEngineKind:
        shown = repr(text)[:60] if isinstance(text, str) else f"of type {type(text).__name__}"
        raise ExplorerError(f"unknown engine {shown}; known: raw, bridge, renderers, {', '.join(sorted(NEWEST))} or "
                            f"one of their versions ({', '.join(PINNED)}), or any vllm@X / sglang@X release on "
                            "PyPI") from None
    problem = proxy_problem(spec)  # before the release: a name is data, a release may be a question to PyPI
    if problem is not None:
        raise ExplorerError(problem)
    if spec.is_serving_engine and (spec.parsers or spec.real_code or spec.flags or
                                   spec.release not in {*PINNED, *NEWEST}):
        # A release (vllm@0.31.0, real:vllm@0.33.0) or a parser pair (vllm/qwen3+hermes): get_engine says if it is one.
        try:
            get_engine(spec)
        except ValueError as err:
            raise ExplorerError(str(err)) from None
    return spec  # raw, bridge, renderers (a version of it: the cell says when it is not the one installed)
