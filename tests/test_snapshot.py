"""The default matrix, byte for byte: every refactor keeps it; a change that moves it regenerates it on purpose
(`python tests/snapshots/regenerate.py`) and says which cells moved and why."""

import json

import pytest

from tests.snapshots.regenerate import DEFAULT_MATRIX, default_matrix_json

pytestmark = [pytest.mark.slow, pytest.mark.real_engine]


def test_default_matrix_equals_the_snapshot():
    _assert_snapshot(default_matrix_json())


# Three models whose templates the store of prompts keeps: their rows of the matrix, every scenario and column
KEPT_MODELS = ("qwen3.6", "glm-5.1", "kimi-k2.6")


def test_rows_from_kept_prompts_equal_the_snapshot(monkeypatch) -> None:
    # The store of prompts on (the suite turns it off, tests/conftest.py), in the engine cache as a user's run keeps
    # it: the first run keeps what it renders (or reads what a run of this code kept), the second reads every prompt
    # back (it keeps nothing new) and gives the same cells.
    from engine.render_store import STORE, render_folder
    from engine.serving.real.results import pack_entries, result_cache

    monkeypatch.setenv("DRIFT_RENDER_STORE", "1")
    folder = result_cache().folder / STORE / render_folder().fingerprint
    expected = {key: cell for key, cell in _cells(DEFAULT_MATRIX.read_bytes()).items() if key[0] in KEPT_MODELS}
    kept = []
    for _ in range(2):
        now = _cells(default_matrix_json("--models", ",".join(KEPT_MODELS)))
        moved = sorted(k for k in expected.keys() | now.keys() if expected.get(k) != now.get(k))
        assert not moved, f"{len(moved)} cells differ from tests/snapshots/default_matrix.json, e.g. {moved[:5]}"
        kept.append(sum(1 for _ in pack_entries(folder)))  # entries, not keys: a second entry of a key is new too
    assert kept[0] >= 301 and kept[1] == kept[0]  # 301: the three rows' distinct requests in a warm run


def _cells(matrix_json: bytes) -> dict[tuple[str, str, str], dict]:
    return {(c["model"], c["scenario"], c["engine"]): c for c in json.loads(matrix_json)["cells"]}


def _assert_snapshot(now: bytes) -> None:
    if now == DEFAULT_MATRIX.read_bytes():
        return
    # Name the cells that moved, so the failure says what to explain.
    before, after = _cells(DEFAULT_MATRIX.read_bytes()), _cells(now)
    moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    pytest.fail(f"{len(moved)} cells differ from tests/snapshots/default_matrix.json, e.g. {moved[:5]}")
