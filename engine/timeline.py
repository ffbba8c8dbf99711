"""A cell on every release of an engine: where its outcome changed, from the releases' own code.

`timeline(model, scenario, "sglang", first="0.5.10", last="0.5.15")` runs the cell on each release through the
real-engine backend (engine/serving/real; the pinned releases too, so every row is that release's code) and returns
one `ReleaseOutcome` per release: status, first break and cause, and what the engine returned for each model turn.
`changed` marks a release whose outcome differs from the release before it. `bisect=True` runs only the releases a
binary search between the two ends needs, assuming one change between them; it finds the first release whose
outcome differs from `first`'s. `TimelineRun` computes the same rows release by release in a background thread, for
a caller (the app's release strip) that shows them as they arrive instead of waiting for all of them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from packaging.version import Version

from engine.serving.real import fetch
from engine.serving.spec import EngineSpec, ParserPair
from engine.simulate import CellResult, run_cell


@dataclass(frozen=True)
class ReleaseOutcome:
    engine: str  # vllm | sglang
    version: str
    status: str
    first_break: int | None  # the 1-based boundary that breaks, or None
    cause: dict | None  # Cause.to_json()
    parses: tuple[dict, ...]  # per boundary: what the engine returned (reasoning, content, tool_calls, error)
    note: str | None
    changed: bool = False  # differs from the previous release run

    @property
    def release(self) -> str:
        return f"{self.engine}@{self.version}"

    @property
    def signature(self) -> tuple:
        cause = (self.cause or {}).get("kind"), (self.cause or {}).get("stage")
        parses = tuple((p.get("reasoning"), p.get("content"),
                        tuple((c["name"], c["arguments"]) for c in p.get("tool_calls", ()))) for p in self.parses)
        return self.status, self.first_break, cause, parses

    def to_json(self) -> dict:
        return {"release": self.release, "status": self.status, "first_break": self.first_break, "cause": self.cause,
                "parses": list(self.parses), "note": self.note, "changed": self.changed}


def releases(engine: str, first: str | None = None, last: str | None = None) -> list[str]:
    """The engine's releases between `first` and `last` (inclusive), oldest first; ValueError in one sentence for an
    end that is not a version (before PyPI's index is read)."""
    for end in (first, last):
        problem = fetch.release_name_problem(engine, end) if end is not None else None
        if problem is not None:
            raise ValueError(problem)
    versions = [r.version for r in fetch.list_releases(engine)]
    low = Version(first) if first else None
    high = Version(last) if last else None
    return [v for v in versions if (low is None or Version(v) >= low) and (high is None or Version(v) <= high)]


def _outcome(cell: CellResult, release: EngineSpec) -> ReleaseOutcome:
    focus = next((b for b in cell.boundaries if not b.holds), None)
    parses = tuple({key: value for key, value in b.parse.to_json().items() if key != "edits"}
                   for b in cell.boundaries)
    for parse in parses:
        for call in parse.get("tool_calls", []):
            call.pop("id", None)  # random per run
    return ReleaseOutcome(release.kind, release.version or "", cell.status, focus.index if focus else None,
                          cell.cause.to_json() if cell.cause else None, parses, cell.note)


def outcome(model: str, scenario: str, engine: str, version: str, kwargs: dict | None = None,
            pair: ParserPair | None = None) -> ReleaseOutcome:
    """The cell on one release, from its own code (real:, the pinned releases too); `pair` replaces the model's own
    parser pair."""
    release = EngineSpec(engine, version)  # type: ignore[arg-type]  # engine: vllm | sglang
    return _outcome(run_cell(model, scenario, replace(release, parsers=pair, real_code=True), kwargs), release)


def marked(ordered: list[ReleaseOutcome]) -> list[ReleaseOutcome]:
    """The rows with `changed` set where a release's outcome differs from the release before it."""
    rows = ordered[:1]
    for previous, current in zip(ordered, ordered[1:]):
        rows.append(ReleaseOutcome(**{**current.__dict__, "changed": current.signature != previous.signature}))
    return rows


def timeline(model: str, scenario: str, engine: str, *, first: str | None = None, last: str | None = None,
             bisect: bool = False, kwargs: dict | None = None) -> list[ReleaseOutcome]:
    versions = releases(engine, first, last)
    if not versions:
        raise ValueError(f"no {engine} release between {first or 'the first'} and {last or 'the last'}")
    results: dict[str, ReleaseOutcome] = {}

    def run(version: str) -> ReleaseOutcome:
        if version not in results:
            results[version] = outcome(model, scenario, engine, version, kwargs)
        return results[version]

    if bisect and len(versions) > 2:
        low, high = 0, len(versions) - 1
        start = run(versions[low]).signature
        if run(versions[high]).signature != start:
            while high - low > 1:
                middle = (low + high) // 2
                if run(versions[middle]).signature == start:
                    low = middle
                else:
                    high = middle
    else:
        for version in versions:
            run(version)
    return marked([results[v] for v in versions if v in results])


class TimelineRun:
    """A cell's timeline over every release of `engine`, computed oldest first in a daemon thread.

    `rows()` is what has arrived so far (marked as `timeline` marks them), `done` whether all have, `error` the
    sentence of a failure that stopped the run (a release whose cell fails is a row with status "error", not that).
    Cost: one cell per release, about 1 s cold each (its worker starting), milliseconds warm."""

    def __init__(self, model: str, scenario: str, engine: str, *, kwargs: dict | None = None,
                 pair: ParserPair | None = None) -> None:
        self.model, self.scenario, self.engine, self.kwargs, self.pair = model, scenario, engine, kwargs, pair
        self.versions = releases(engine)
        self._outcomes: list[ReleaseOutcome] = []
        self._lock = threading.Lock()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"timeline {model} {scenario} {engine}", daemon=True)

    def start(self) -> TimelineRun:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for version in self.versions:
                row = outcome(self.model, self.scenario, self.engine, version, self.kwargs, self.pair)
                with self._lock:
                    self._outcomes.append(row)
        except Exception as err:  # noqa: BLE001 - the run stops with one sentence; rows so far stay
            self.error = f"{self.engine} release timeline stopped: {type(err).__name__}: {err}"

    @property
    def done(self) -> bool:
        return not self._thread.is_alive() and (self.error is not None or len(self._outcomes) == len(self.versions))

    def rows(self) -> list[ReleaseOutcome]:
        with self._lock:
            return marked(list(self._outcomes))

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)
