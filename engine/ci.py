"""The CI gate for template and client authors, as a pytest plugin (the `pytest11` entry point `drift_matrix`,
loaded by pytest once the package is installed; `-p engine.ci` loads it without installing).

    from engine.ci import assert_prefix_stable

    def test_my_template_keeps_the_cache():
        assert_prefix_stable("templates/chat.jinja", model="qwen3.5", engine="vllm@0.33.0")

`assert_prefix_stable` runs the template through every scenario (or those named) exactly as
`python -m engine check` does, and fails the test with check's report (each break's cause at its template line)
when any scenario breaks PRR or errors. The `drift_matrix` fixture gives the same as `drift_matrix.assert_prefix_stable`
and runs matrix cells for a client author: `drift_matrix.cells(models=[...], scenarios=[...], engines=[...])`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.check import CheckReport, check_template
from engine.simulate import CellResult


class PrefixBreak(AssertionError):
    """A template breaks PRR (or fails to render) in a scenario: the message is check's report."""

    def __init__(self, report: CheckReport) -> None:
        super().__init__(f"{report.template} does not keep the prefix for {report.model} (engine "
                         f"{report.engine}):\n{report.text}")
        self.report = report


def assert_prefix_stable(template: str | Path, *, model: str, engine: str = "raw",
                         scenarios: Sequence[str] | None = None) -> CheckReport:
    """Fail (PrefixBreak, an AssertionError) unless every scenario holds with `template` as `model`'s chat template
    under `engine`; the report when they all do."""
    report = check_template(model, Path(template), engine, scenarios)
    if report.failed:
        raise PrefixBreak(report)
    return report


class DriftMatrix:
    """What the `drift_matrix` fixture gives a test."""

    assert_prefix_stable = staticmethod(assert_prefix_stable)

    @staticmethod
    def cells(models: Sequence[str], scenarios: Sequence[str], engines: Sequence[str] = ("vllm",)
              ) -> dict[tuple[str, str, str], CellResult]:
        """Matrix cells keyed (model, scenario, engine as given)."""
        from engine.simulate import run_cell

        return {(m, s, e): run_cell(m, s, e, {}) for m in models for s in scenarios for e in engines}


@pytest.fixture
def drift_matrix() -> DriftMatrix:
    return DriftMatrix()
