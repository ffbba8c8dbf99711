"""Regenerate tests/tokenizer_ids/<tokenizer>.json: the ids our real tokenizers give strings.json's strings.

Run after a tokenizer's pinned file changes (and after proving it against ../shared/tokenizer-vectors, which
tests/test_tokenizers.py does where ../shared is present): `python tests/tokenizer_ids/generate.py`. A fresh clone
without ../shared checks the tokenizers against these files (tests/test_tokenizer_ids.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

# One model per distinct tokenizer file (qwen3.5 shares qwen3.6's, qwen3-2507 qwen3-coder's, glm-4.7-flash
# glm-5.1's; Kimi has none offline).
TOKENIZER_MODELS = ("qwen3.6", "glm-5.1", "deepseek-v4", "gpt-oss", "qwen3-coder", "qwen2.5", "deepseek-v3.1")


def generate() -> None:
    from engine.models import build_tokenizer, load_spec

    strings = json.loads((HERE / "strings.json").read_text(encoding="utf-8"))
    for model_id in TOKENIZER_MODELS:
        tokenizer, asset = build_tokenizer(load_spec(model_id))
        ids = [list(tokenizer.encode(text).ids) for text in strings]
        data = {"model": model_id, "source": asset.source, "sha256": asset.sha256, "ids": ids}
        (HERE / f"{model_id}.json").write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    generate()
