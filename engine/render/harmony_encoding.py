"""Rebuild tiktoken's `o200k_base.tiktoken` offline so openai-harmony can load the GPT-OSS encoding.

The file comes from PyPI package quicktok-v1==0.4.0 (`quicktok/data/o200k.vocab`): a u32 little-endian count, then
records of (u16 little-endian byte length, token bytes, u32 little-endian rank). tiktoken's file is
`base64(bytes) rank` per line in rank order; the result is verified against tiktoken's own expected sha256.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import os
import struct
from pathlib import Path

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CACHE_DIR = Path(os.environ.get("DRIFT_EXPLORER_CACHE", Path.home() / ".cache" / "drift-explorer")) / "tiktoken"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_quicktok_vocab(data: bytes) -> list[tuple[int, bytes]]:
    (count,) = struct.unpack_from("<I", data, 0)
    offset = 4
    ranked: list[tuple[int, bytes]] = []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        offset += 2
        token = data[offset : offset + length]
        offset += length
        (rank,) = struct.unpack_from("<I", data, offset)
        offset += 4
        ranked.append((rank, token))
    ranked.sort()
    return ranked


def o200k_base_path() -> Path:
    """Path of a verified `o200k_base.tiktoken`, rebuilt on first use; sets TIKTOKEN_ENCODINGS_BASE to its folder."""
    target = CACHE_DIR / "o200k_base.tiktoken"
    if not (target.exists() and _sha256(target) == O200K_BASE_SHA256):
        source = importlib.resources.files("quicktok").joinpath("data/o200k.vocab").read_bytes()
        lines = [f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in _read_quicktok_vocab(source)]
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        partial.write_text("".join(lines), encoding="ascii")
        digest = _sha256(partial)
        if digest != O200K_BASE_SHA256:
            partial.unlink()
            raise RuntimeError(f"rebuilt o200k_base.tiktoken has sha256 {digest}, expected {O200K_BASE_SHA256}")
        partial.replace(target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(target.parent)
    return target
