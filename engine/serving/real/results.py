"""A persistent, content-addressed cache of what a release's own code answered.

A worker's answer depends only on the release's code, the serving glue that drives it (this package), the light
dependencies it runs for real, the interpreter, and the job (text, parser pair, tools, request fields, vocabulary).
So the answer is stored under the sha256 of all of these and read back instead of asking the worker again: a warm
matrix starts no worker at all.

Layout, beside the sources in the engine cache (`fetch.cache_dir()`):

    results/<engine>@<version>/<key[:2]>/<key>.json   {"key": key, "sha256": of the reply's bytes, "reply": {...}}

An entry whose key or sha256 does not match what it holds (a torn write, a tampered file) is not trusted: it is
deleted and the job asked again. Only what the release's code answered (a result, or its own refusal of the job) is
kept; a worker that hung, crashed, ran out of memory or could not start leaves nothing behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.serving.real import fetch

# In-memory answers kept per process, most recently used last (a default matrix asks about 1,200 distinct jobs).
MEMORY_ENTRIES = 20_000


def _canonical(data: Any) -> bytes:
    # Key order is kept, not sorted: the order of a tool's arguments or a message's fields is part of the job (a
    # template prints them in order), and of the answer.
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode()


ROOT = Path(__file__).resolve().parents[3]


@functools.cache
def glue_fingerprint() -> str:
    """The sha256 of what drives a release in its worker besides the release itself: every module of this package,
    the render modules its encoder tracer imports, the pinned packages the parsers run for real (requirements.txt),
    and the interpreter. A change to any of them can change an answer."""
    digest = hashlib.sha256(sys.version.encode())
    here = Path(__file__).resolve().parent
    hash_files(digest, [*sorted(here.glob("*.py")), *sorted((ROOT / "engine" / "render").glob("*.py")),
                        ROOT / "requirements.txt"])
    return digest.hexdigest()


def hash_files(digest: Any, paths: list[Path]) -> None:
    """Feed each file that exists to `digest`: its path under the project, then its bytes."""
    for path in paths:
        if path.is_file():
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")


@dataclass(frozen=True)
class ReleaseFingerprint:
    """What identifies the code a release's answer came from."""

    spec: str
    wheel_sha256: str
    dependencies: tuple[str, ...]  # name@version of each dependency run for real

    def key(self, job: dict) -> str:
        # The sha256 of _canonical({"release", "wheel", "dependencies", "glue", "job": job}): the part before the
        # job is hashed once per fingerprint, then only the job's bytes per ask.
        digest = _head_digest(self).copy()
        digest.update(_canonical(job) + b"}")
        return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _head_digest(fingerprint: ReleaseFingerprint) -> Any:
    head = _canonical({"release": fingerprint.spec, "wheel": fingerprint.wheel_sha256,
                       "dependencies": list(fingerprint.dependencies), "glue": glue_fingerprint()})
    return hashlib.sha256(head[:-1] + b',"job":')


def release_fingerprint(spec: str, dependencies: fetch.Dependencies) -> ReleaseFingerprint | None:
    """The fingerprint of a release whose sources are in the cache (its wheel's sha256 from the manifest), else None."""
    wheel_sha256 = fetch.cached_wheel_sha256(spec)
    if not wheel_sha256:
        return None
    return ReleaseFingerprint(spec, wheel_sha256, tuple(sorted(s.spec for s in dependencies.real.values())))


def _entry(key: str, body: bytes) -> bytes:
    """An entry's bytes: the JSON object {"key", "sha256", "reply"} with the reply's own bytes last, so that a read
    checks the hash over those bytes and parses them once (no second serialization)."""
    return _entry_head(key, hashlib.sha256(body).hexdigest()) + body + b"}"


def _entry_head(key: str, sha256: str) -> bytes:
    return b'{"key":"' + key.encode() + b'","sha256":"' + sha256.encode() + b'","reply":'


def _verified_reply(raw: bytes, key: str) -> dict | None:
    """The reply an entry holds, or None when the entry is not exactly what `_entry` wrote for `key` (torn, edited,
    rewritten in another layout, or another key's)."""
    start = len(_entry_head(key, "0" * 64))  # a sha256 is 64 hex digits: the head's length is the key's alone
    body = raw[start:-1]
    if len(raw) <= start or not raw.endswith(b"}") or raw[:start] != _entry_head(key,
                                                                               hashlib.sha256(body).hexdigest()):
        return None
    try:
        reply = json.loads(body)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


class ResultCache:
    """Answers by key: memory first, then the files under `folder` (checked by hash on every read)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.memory: OrderedDict[str, dict] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = self.rejected = 0

    def _path(self, spec: str, key: str) -> Path:
        return self.folder / spec / key[:2] / f"{key}.json"

    def get(self, spec: str, key: str) -> dict | None:
        with self.lock:
            reply = self.memory.get(key)
            if reply is not None:
                self.memory.move_to_end(key)
                self.hits += 1
                return reply
        path = self._path(spec, key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError:
            raw = b""  # unreadable: rejected below
        reply = _verified_reply(raw, key)
        if reply is None:
            self.rejected += 1
            self.misses += 1
            path.unlink(missing_ok=True)
            return None
        self._remember(key, reply)
        self.hits += 1
        return reply

    def holds_answers_of(self, spec: str) -> bool:
        """Whether any answer of `spec` is stored (a warm release: a run asks its worker little or nothing)."""
        try:
            return any((self.folder / spec).iterdir())
        except OSError:
            return False

    def put(self, spec: str, key: str, reply: dict) -> None:
        self._remember(key, reply)
        try:
            fetch.write_atomic(self._path(spec, key), _entry(key, _canonical(reply)))
        except OSError:
            pass  # a read-only or full cache only costs the next run a worker call

    def _remember(self, key: str, reply: dict) -> None:
        with self.lock:
            self.memory[key] = reply
            self.memory.move_to_end(key)
            while len(self.memory) > MEMORY_ENTRIES:
                self.memory.popitem(last=False)

    def clear_memory(self) -> None:
        with self.lock:
            self.memory.clear()


_CACHES: dict[Path, ResultCache] = {}
_CACHES_LOCK = threading.Lock()


def result_cache() -> ResultCache:
    """The cache under the current engine cache folder (one per folder: tests point DRIFT_ENGINE_CACHE elsewhere), or
    in DRIFT_RESULT_CACHE_DIR (the bench's cold run: an empty cache beside the cached sources)."""
    folder = Path(os.environ.get("DRIFT_RESULT_CACHE_DIR") or fetch.cache_dir() / "results")
    with _CACHES_LOCK:
        cache = _CACHES.get(folder)
        if cache is None:
            cache = _CACHES[folder] = ResultCache(folder)
        return cache


def persisted_results_enabled() -> bool:
    """`DRIFT_RESULT_CACHE=0` turns the persisted answers off (the bench's cold figure; a suspicious user)."""
    return os.environ.get("DRIFT_RESULT_CACHE", "1") != "0"
