"""The default matrix, byte for byte: every refactor keeps it; a change that moves it regenerates it on purpose
(`python tests/snapshots/regenerate.py`) and says which cells moved and why."""

import json

import pytest

from tests.snapshots.regenerate import DEFAULT_MATRIX, default_matrix_json

pytestmark = [pytest.mark.slow, pytest.mark.real_engine]


def test_default_matrix_equals_the_snapshot():
    now = default_matrix_json()
    if now == DEFAULT_MATRIX.read_bytes():
        return
    # Name the cells that moved, so the failure says what to explain.
    before = {(c["model"], c["scenario"], c["engine"]): c for c in json.loads(DEFAULT_MATRIX.read_bytes())["cells"]}
    after = {(c["model"], c["scenario"], c["engine"]): c for c in json.loads(now)["cells"]}
    moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    pytest.fail(f"{len(moved)} cells differ from tests/snapshots/default_matrix.json, e.g. {moved[:5]}")
