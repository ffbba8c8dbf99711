"""The default matrix, byte for byte: every refactor keeps it; a change that moves it regenerates it on purpose
(`python tests/snapshots/regenerate.py`) and says which cells moved and why."""

import json
import os

import pytest

from tests.snapshots.regenerate import DEFAULT_MATRIX, default_matrix_json

pytestmark = [pytest.mark.slow, pytest.mark.real_engine]


def test_default_matrix_equals_the_snapshot():
    _assert_snapshot(default_matrix_json())


def test_default_matrix_from_kept_prompts_equals_the_snapshot(monkeypatch) -> None:
    # The store of prompts on (the suite turns it off, tests/conftest.py), in the engine cache as a user's run keeps
    # it: the first run keeps what it renders (or reads what a run of this code kept), the second reads it all back.
    from engine.render_store import STORE, render_folder
    from engine.serving.real.results import result_cache

    monkeypatch.setenv("DRIFT_RENDER_STORE", "1")
    folder = result_cache().folder / STORE / render_folder().fingerprint
    _assert_snapshot(default_matrix_json())
    kept = sum(len(files) for _, _, files in os.walk(folder))
    assert kept >= 960  # the distinct requests of the default matrix's Jinja templates that do not read the clock
    _assert_snapshot(default_matrix_json())


def _assert_snapshot(now: bytes) -> None:
    if now == DEFAULT_MATRIX.read_bytes():
        return
    # Name the cells that moved, so the failure says what to explain.
    before = {(c["model"], c["scenario"], c["engine"]): c for c in json.loads(DEFAULT_MATRIX.read_bytes())["cells"]}
    after = {(c["model"], c["scenario"], c["engine"]): c for c in json.loads(now)["cells"]}
    moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    pytest.fail(f"{len(moved)} cells differ from tests/snapshots/default_matrix.json, e.g. {moved[:5]}")
