"""The fingerprint of the explorer's own code and data, for what it keeps across runs of what this code computed (proved
causes: engine/cause_store.py; template prompts: engine/render_store.py): an edit anywhere in `engine`, a model
manifest or a pinned package's version gives another fingerprint, and what the old code computed is never read
again."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import re
from pathlib import Path

from engine.serving.real.results import hash_files

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def code_fingerprint() -> str:
    """The sha256 of the code and data the explorer computes with: every module of `engine`, the model manifests and
    the versions of the packages requirements.txt installs (transformers, jinja2, tokenizers, …)."""
    digest = hashlib.sha256()
    hash_files(digest, [path for path in [*sorted((ROOT / "engine").rglob("*.py")),
                                          *sorted((ROOT / "model_assets").rglob("*"))]
                        if "__pycache__" not in path.parts])
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        name = re.match(r"\s*([A-Za-z0-9_.\-]+)", line.split("#", 1)[0])
        if name:
            try:
                version = importlib.metadata.version(name.group(1))
            except importlib.metadata.PackageNotFoundError:
                version = "-"
            digest.update(f"{name.group(1)}=={version}\0".encode())
    return digest.hexdigest()
