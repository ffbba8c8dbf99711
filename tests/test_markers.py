"""The marker table (tests/conftest.py MARKS) names tests that exist, and marks what the fast loop leaves out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import LONGEST_FIRST, MARKS, marks_for

TESTS = Path(__file__).resolve().parent


def _test_functions(relative: str) -> set[str]:
    tree = ast.parse((TESTS / relative).read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


@pytest.mark.parametrize("relative", sorted(MARKS))
def test_every_pattern_names_a_test_of_its_file(relative: str) -> None:
    functions = _test_functions(relative)
    named = {pattern.split("[", 1)[0] for pattern in MARKS[relative] if pattern != "*"}
    assert named - functions == set()


def test_marks_by_name_and_parameters() -> None:
    assert marks_for("test_browser.py", "test_session_page_opens") == {"browser", "slow", "real_engine"}
    assert marks_for("test_parsers_golden.py", "test_bad_input_returns_quickly[False-huge-sglang@0.5.23]") == {"slow"}
    assert marks_for("test_parsers_golden.py", "test_bad_input_returns_quickly[False-empty-sglang@0.5.23]") == set()
    assert marks_for("test_findings.py", "test_drift_matrix_row[qwen3.6/tool-call/raw]") == {"real_engine"}
    assert marks_for("test_findings.py", "test_drift_matrix_row[qwen3.6/tool-call/vllm@0.33.0]") == {
        "slow", "real_engine"}
    assert marks_for("test_render.py", "test_anything") == set()


def test_collected_tests_carry_their_marks(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("slow") is None  # this file is part of the fast loop
    for item in request.session.items:
        path = Path(item.fspath)
        if path.is_relative_to(TESTS):
            expected = marks_for(path.relative_to(TESTS).as_posix(), item.name)
            assert {m for m in expected if item.get_closest_marker(m) is None} == set(), item.nodeid


def test_the_longest_files_named_first_exist_once() -> None:
    assert [f for f in LONGEST_FIRST if not (TESTS / f).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
