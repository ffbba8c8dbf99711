import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# ../shared beside the clone, as in CI; SHARED_DIR overrides.
SHARED = Path(__import__("os").environ.get("SHARED_DIR", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: tests read tokenizer vectors and seeds from ../shared")
    return SHARED


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
