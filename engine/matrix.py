"""The drift matrix: every model × scenario × engine cell, and its JSON contract (`python -m engine matrix`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import ExplorerError
from engine.models import default_model_ids, load_spec
from engine.scenario import load_scenario, scenario_ids
from engine.serving.registry import parse_engine, spawn_releases
from engine.serving.spec import EngineSpec
from engine.simulate import ENGINES, Boundary, CellResult, run_cell

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class MatrixRequest:
    models: tuple[str, ...]
    scenarios: tuple[str, ...]
    engines: tuple[EngineSpec | str, ...]  # names are parsed by run_cell; the CLI passes them parsed
    kwargs: dict[str, dict[str, Any]]  # model id -> template kwargs


def default_request() -> MatrixRequest:
    return MatrixRequest(tuple(default_model_ids()), tuple(scenario_ids()), ENGINES, {})


# At most this many threads compute a matrix's cells together while a release it asks is cold (see run_matrix): one
# per release column and one for the other columns, as the default matrix has.
MAX_COLD_THREADS = 3


def run_matrix(request: MatrixRequest, *, explain: bool = True) -> list[CellResult]:
    """Every cell of the request; `explain=False` leaves the causes out (status and prefixes only)."""
    # The releases' workers load while the first cells render (a cold result cache asks them; a warm one never waits)
    cold = spawn_releases(request.engines, parser_pairs(request.models))
    cells = [(m, s, e) for m in request.models for s in request.scenarios for e in request.engines]

    def compute(cell: tuple[str, str, EngineSpec | str]) -> CellResult:
        model_id, scenario_id, engine = cell
        return run_cell(model_id, scenario_id, engine, request.kwargs.get(model_id, {}), explain=explain)

    if not cold:  # every answer read from the result cache: one thread, the cells are CPU alone
        return [compute(cell) for cell in cells]
    # A cold release answers each job in its worker process (one process per release, tens of ms of its CPU a job).
    # One lane per release the columns ask, and one for the other columns (which ask a release only for a fix hint),
    # each in the matrix's order and taken by a thread of its own: every worker then has a cell asking it while the
    # other threads render and tokenize, and the parent's work and the workers' fill both cores (two threads on one
    # serving lane made that release's worker the queue, 20-25 % slower cold). In the matrix's order, not by
    # interleaving models: a worker builds its serving objects for one parser pair at a time (glue_*.py
    # Glue.serving), so a release asked for one model after another would rebuild them at every ask.
    releases = [_release_asked(engine) for _, _, engine in cells]
    lanes = [lane for wanted in [*dict.fromkeys(r for r in releases if r is not None), None]
             if (lane := [n for n, release in enumerate(releases) if release == wanted])]
    return in_threads(compute, cells, min(len(lanes), MAX_COLD_THREADS), lanes)


def parser_pairs(model_ids: Iterable[str]) -> list[dict[str, dict[str, str]]]:
    """Each known model's parser pair by engine, as its manifest names them (spawn_releases: which releases a matrix
    of these models asks); an unknown id is left out (its cells say why)."""
    found = []
    for model_id in model_ids:
        try:
            found.append(load_spec(model_id).engine_parsers)
        except ExplorerError:
            continue
    return found


def _release_asked(engine: EngineSpec | str) -> str | None:
    """The release whose worker a column's cells ask (`vllm@0.33.0` for any of its columns), None for raw, the
    bridge, renderers and an engine name no registry knows (its cells say so)."""
    try:
        spec = parse_engine(engine) if isinstance(engine, str) else engine
    except ValueError:
        return None
    return spec.release if spec.is_serving_engine else None


def in_threads(compute: Callable[[T], R], items: list[T], threads: int, lanes: list[list[int]]) -> list[R]:
    """`[compute(item) for item in items]`, computed by `threads` threads. `lanes`: the positions of `items`, each
    position in one lane; thread n takes the next item of lane n % len(lanes), or of the first lane with items left
    when that one is done. The first exception is raised once the threads stop (each stops at its next item)."""
    results: list[R | None] = [None] * len(items)
    queues = [iter(lane) for lane in lanes]
    lock = threading.Lock()
    failed = threading.Event()

    def next_position(preferred: int) -> int | None:
        with lock:
            for queue in [queues[preferred], *queues]:
                position = next(queue, None)
                if position is not None:
                    return position
        return None

    def work(thread: int) -> None:
        while not failed.is_set():
            position = next_position(thread % len(queues))
            if position is None:
                return
            try:
                results[position] = compute(items[position])
            except BaseException:
                failed.set()
                raise

    with ThreadPoolExecutor(threads, thread_name_prefix="matrix") as pool:
        for done in [pool.submit(work, n) for n in range(min(threads, len(items)))]:
            done.result()
    return results  # type: ignore[return-value] - every position was computed


def boundary_json(b: Boundary) -> dict:
    return {
        "index": b.index,
        "trigger": b.trigger,
        "string_prefix": b.string_prefix.to_json(),
        "token_prefix": b.token_prefix.to_json() if b.token_prefix else None,
        "reused_tokens": b.reused_tokens,
        "prefill_tokens": b.prefill_tokens,
        "truncated": b.completion.truncated,
    }


def cell_json(cell: CellResult) -> dict:
    focus = cell.focus
    return {
        "model": cell.model,
        "scenario": cell.scenario,
        "engine": cell.engine,
        "engine_version": cell.engine_version,
        "kwargs": cell.kwargs,
        "status": cell.status,
        "string_prefix": focus.string_prefix.to_json() if focus else None,
        "token_prefix": focus.token_prefix.to_json() if focus and focus.token_prefix else None,
        "reused_tokens": focus.reused_tokens if focus else None,
        "prefill_tokens": focus.prefill_tokens if focus else None,
        "cause": cell.cause.to_json() if cell.cause else None,
        "note": cell.note,
        "renderer": cell.renderer,  # which renderer built the prompts (the engine's own where it has one)
        "request_side": cell.request_side,  # which code prepared the messages (emulation or the release's own)
        "boundaries": [boundary_json(b) for b in cell.boundaries],
        # A column with layers (issue 27) says which: its name as asked and what the cell passed, client side first.
        **({"column": cell.column, "layers": list(cell.layers)} if cell.column else {}),
    }


def matrix_json(cells: list[CellResult]) -> dict:
    scenarios = sorted({c.scenario for c in cells})
    return {
        "scenarios": {s: load_scenario(s).description for s in scenarios},
        "cells": [cell_json(c) for c in cells],
    }


STATUS_MARK = {"holds": "✓", "breaks": "✗", "error": "!", "unavailable": "–"}


def cell_label(cell: CellResult, level: str = "token") -> str:
    """Status mark plus what the cell loses: tokens (characters when string level is asked or all there is)."""
    focus = cell.focus
    if focus is None or cell.status in ("error", "unavailable"):
        return STATUS_MARK[cell.status]
    check = focus.token_prefix if level == "token" and focus.token_prefix else focus.string_prefix
    if not check.holds:
        unit = "tok" if check is focus.token_prefix else "chr"
        return f"✗ -{check.prev_len - check.common}{unit}"
    if cell.status == "breaks":  # breaks at token level only, and string level was asked for
        return "✓ str"
    return STATUS_MARK[cell.status]
