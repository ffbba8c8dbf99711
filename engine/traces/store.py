"""Uploaded traces kept in the workspace: validated first (read whole, every record), stored atomically by content.

    <workspace>/traces/<id>/meta.json        original name, format, sha256, size, requests, sessions, created
    <workspace>/traces/<id>/<sha256>.trace   the file as uploaded
    <workspace>/traces/.tmp-<id>-<random>/   a trace being written (never read; reported by `list()`)

The id is the first 16 hex digits of the content's sha256, so the same file uploaded twice is stored once. As with
template uploads (engine/workspace.py, whose atomic writes this reuses), a crash leaves a complete trace or none.

A bad record does not refuse the file, as with `python -m engine trace`: the file is stored as uploaded, its good
records are analysed (engine/traces/readers.py says what is kept, per format), and meta.json keeps the sentences of
the first SKIPPED_KEPT bad records and how many there were. A file none of whose records is complete is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

from engine.errors import ExplorerError
from engine.traces.grouping import SessionGrouping
from engine.traces.readers import read_trace
from engine.traces.records import SkippedRecords, TraceFormatError, skipped_sentence
from engine.workspace import VisitorLimits, check_room, default_root, fsync_dir, write_atomic

_MB = 1024 * 1024
META = "meta.json"
SKIPPED_KEPT = 5  # bad records named in meta.json; the rest are counted


@dataclass(frozen=True)
class TraceLimits:
    max_bytes: int = 50 * _MB  # DRIFT_TRACE_MAX_BYTES; the app's server takes 50 MB (.streamlit/config.toml)

    @classmethod
    def from_env(cls) -> TraceLimits:
        from engine.sandbox import env_overrides

        values = env_overrides(cls, "DRIFT_TRACE_")
        for f in fields(cls):
            if f.name in values and values[f.name] <= 0:
                raise ExplorerError(f"environment variable DRIFT_TRACE_{f.name.upper()} must be greater than 0")
        return cls(**values)


@dataclass(frozen=True)
class StoredTrace:
    id: str
    name: str
    format: str
    sha256: str
    size: int
    requests: int
    sessions: int
    created: str
    path: Path  # the stored file
    skipped: tuple[str, ...] = ()  # the first SKIPPED_KEPT bad records' sentences, in file order
    skipped_count: int = 0  # bad records in all (each left out of the analysis)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "path"}
        out["skipped"] = list(self.skipped)
        return out


@dataclass(frozen=True)
class TraceCheck:
    """What reading a whole trace file found: its format, complete requests, sessions, and the bad records left out."""

    format: str
    requests: int
    sessions: int
    skipped: tuple[str, ...]  # the first SKIPPED_KEPT bad records' sentences
    skipped_count: int


def validate_trace(name: str, path: Path) -> TraceCheck:
    """Read every record of the file at `path` (ids only: no model needed), leaving the bad ones out as the analysis
    does; TraceFormatError when no record is a complete request."""
    grouping = SessionGrouping()
    count, trace_format = 0, ""
    skipped = SkippedRecords(kept=SKIPPED_KEPT)
    for request in read_trace(path, name=name, skipped=skipped):
        count, trace_format = count + 1, request.format
        grouping.assign(request)
    if not count:
        if skipped:
            raise TraceFormatError(skipped_sentence(skipped).replace("the rest of the file was read",
                                                                     "no other record is a complete request"))
        raise TraceFormatError(f"{name} holds no complete request (a prompt and its completion)")
    return TraceCheck(trace_format, count, grouping.sessions, tuple(str(e) for e in skipped), skipped.count)


class TraceStore:
    def __init__(self, root: str | Path | None = None, limits: TraceLimits | None = None, *,
                 visitor_limits: VisitorLimits | None = None) -> None:
        """`root`: a workspace's folder; `visitor_limits`: that of a visitor's workspace (engine/workspace.py), whose
        uploads and traces share one cap."""
        self.root = (Path(root).expanduser() if root else default_root()) / "traces"
        self.limits = limits
        self.visitor_limits = visitor_limits

    def add(self, name: str, data: bytes) -> StoredTrace:
        limits = self.limits or TraceLimits.from_env()
        if len(data) > limits.max_bytes:
            raise TraceFormatError(f"{name} is larger than the {limits.max_bytes // _MB} MB limit for traces "
                                   "(DRIFT_TRACE_MAX_BYTES); analyse it with python -m engine trace instead")
        digest = hashlib.sha256(data).hexdigest()
        trace_id = digest[:16]
        if (self.root / trace_id / META).is_file():
            return self.get(trace_id)
        check_room(self.root.parent, len(data), name, self.visitor_limits)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{trace_id}-", dir=self.root))
        try:
            stored = staging / f"{digest}.trace"
            write_atomic(stored, data)
            check = validate_trace(name, stored)
            meta = {"id": trace_id, "name": Path(name).name, "format": check.format, "sha256": digest,
                    "size": len(data), "requests": check.requests, "sessions": check.sessions,
                    "created": datetime.now(UTC).isoformat(timespec="seconds"), "skipped": list(check.skipped),
                    "skipped_count": check.skipped_count}
            write_atomic(staging / META, json.dumps(meta, ensure_ascii=False, indent=2).encode("utf-8"))
            fsync_dir(staging)
            try:
                os.rename(staging, self.root / trace_id)
            except OSError:
                if not (self.root / trace_id).is_dir():
                    raise
                shutil.rmtree(staging, ignore_errors=True)  # stored meanwhile by another session
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return self.get(trace_id)

    def get(self, trace_id: str) -> StoredTrace:
        folder = self.root / trace_id
        try:
            meta = json.loads((folder / META).read_text(encoding="utf-8"))
            # A trace stored before bad records were kept has none.
            optional = {"skipped": tuple(str(s) for s in meta.get("skipped", ())),
                        "skipped_count": int(meta.get("skipped_count", 0))}
            required = {f.name: meta[f.name] for f in fields(StoredTrace) if f.name not in ("path", *optional)}
            return StoredTrace(path=folder / f"{meta['sha256']}.trace", **optional, **required)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ExplorerError(f"stored trace {trace_id} in {self.root} is damaged and was skipped: {err}") from None

    def list(self) -> tuple[list[StoredTrace], list[str]]:
        """Stored traces, oldest first, and one sentence for each entry skipped."""
        if not self.root.is_dir():
            return [], []
        traces, skipped = [], []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".tmp-"):
                skipped.append(f"{entry} is a trace whose upload was interrupted; it is not used (delete it)")
            elif entry.is_dir() and not entry.name.startswith("."):
                try:
                    traces.append(self.get(entry.name))
                except ExplorerError as err:
                    skipped.append(str(err))
        return sorted(traces, key=lambda t: (t.created, t.id)), skipped

    def remove(self, trace_id: str) -> None:
        folder = self.root / trace_id
        if not folder.is_dir() or folder.name.startswith("."):
            raise ExplorerError(f"no stored trace {trace_id!r} in {self.root}")
        doomed = self.root / f".removing-{trace_id}-{secrets.token_hex(4)}"
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
