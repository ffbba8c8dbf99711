"""Regenerate the default matrix snapshot: `python tests/snapshots/regenerate.py`.

The snapshot is `python -m engine matrix --json` of the default request, byte for byte. A commit that moves it says
which cells changed and why; a refactor leaves it as it is (tests/test_snapshot.py compares).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_MATRIX = HERE / "default_matrix.json"


def default_matrix_json(*args: str) -> bytes:
    """The default matrix JSON as the CLI writes it (narrowed by `args`, e.g. --models), from a fresh process (no
    cache of this one leaks in)."""
    done = subprocess.run([sys.executable, "-m", "engine", "matrix", *args, "--json", "-"], cwd=ROOT,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"python -m engine matrix exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return done.stdout


if __name__ == "__main__":
    DEFAULT_MATRIX.write_bytes(default_matrix_json())
    print(f"wrote {DEFAULT_MATRIX.relative_to(ROOT)}")
