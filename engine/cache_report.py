"""What the engine cache's result store holds, spec by spec (`python -m engine cache`): each spec's answers per code
fingerprint, which fingerprint today's code reads, and what a prune removed (engine/serving/real/results.py)."""

from __future__ import annotations

from engine import cause_store, render_store
from engine.errors import ExplorerError
from engine.serving.proxies.litellm import answer_folder
from engine.serving.real.backend import release_dependencies
from engine.serving.real.fetch import ENGINES, cached_sources
from engine.serving.real.results import KEEP_FINGERPRINTS, ResultCache, SpecReport, release_fingerprint


def current_fingerprint(spec: str) -> str | None:
    """The fingerprint under which this code reads `spec`'s answers (None: a release not in the engine cache)."""
    engine, _, version = spec.partition("@")
    if spec == cause_store.STORE:
        return cause_store.cause_folder().fingerprint
    if spec == render_store.STORE:
        return render_store.render_folder().fingerprint
    if engine == "litellm" and version:
        return answer_folder(version).fingerprint
    if engine not in ENGINES or not version:
        return None
    try:
        if cached_sources(spec) is None:  # no fingerprint: its answers cannot be read before a fetch
            return None
        fingerprint = release_fingerprint(spec, release_dependencies(engine, version, offline=True))
    except ExplorerError:  # not a release's name
        return None
    return fingerprint.folder.fingerprint if fingerprint is not None else None


def spec_reports(cache: ResultCache, *, prune: bool = False, keep: int = KEEP_FINGERPRINTS) -> list[SpecReport]:
    """Every spec's report, after its prune when `prune` (`keep` fingerprints kept, the current one included)."""
    if keep < 1:
        raise ExplorerError(f"--keep must be at least 1 (the current fingerprint), got {keep}")
    return [cache.report(spec, current_fingerprint(spec), prune=prune, keep=keep) for spec in cache.specs()]
