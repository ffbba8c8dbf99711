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
