"""A template author's CI: each chat template of this project through the drift matrix's scenarios, with the
drift-matrix pytest plugin (installed with the package; `-p engine.ci` without installing)."""

from pathlib import Path

from engine.ci import assert_prefix_stable

TEMPLATES = Path(__file__).parent / "templates"
# The conversations these templates are for: no tools, the model reasons and answers, the user asks again.
SCENARIOS = ["no-tools-next-user", "reasoning-truncated", "content-truncated"]


def test_keeps_reasoning():
    assert_prefix_stable(TEMPLATES / "keeps-reasoning.jinja", model="qwen3.5", engine="raw", scenarios=SCENARIOS)


def test_drops_reasoning(drift_matrix):
    drift_matrix.assert_prefix_stable(TEMPLATES / "drops-reasoning.jinja", model="qwen3.5", engine="raw",
                                      scenarios=SCENARIOS)
