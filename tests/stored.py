"""Writing into a stored upload behind the workspace's back: what an older version, a hand edit or a damaged disk
leaves, which validation today would refuse."""

from __future__ import annotations

import hashlib
import json

from engine.workspace import Upload


def replace_stored(upload: Upload, role: str, data: bytes, **meta_changes) -> None:
    """Swap the stored file of `role` for `data`, with meta.json agreeing (so only its content is hostile)."""
    meta_path = upload.path / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    entry = next(f for f in meta["files"] if f["role"] == role)
    (upload.path / entry["stored_as"]).unlink()
    digest = hashlib.sha256(data).hexdigest()
    entry.update(sha256=digest, size=len(data), stored_as=digest + "." + entry["stored_as"].rsplit(".", 1)[1])
    (upload.path / entry["stored_as"]).write_bytes(data)
    meta.update(meta_changes)
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
