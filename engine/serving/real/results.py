"""A persistent, content-addressed cache of what a release's own code answered.

A worker's answer depends only on the release's code, the serving glue that drives it (this package), the light
dependencies it runs for real, the interpreter, and the job (text, parser pair, tools, request fields, vocabulary).
So the answer is stored under the sha256 of all of these and read back instead of asking the worker again: a warm
matrix starts no worker at all.

Layout, beside the sources in the engine cache (`fetch.cache_dir()`):

    results/<spec>/<fingerprint>/<writer>.pack   one entry a line: {"key": key, "sha256": of the reply's bytes,
                                                 "reply": {...}}

`<spec>` is `<engine>@<version>` (or `causes`, engine/cause_store.py); `<fingerprint>` is 16 hex digits of the hash
of the code the answers came from (the release's wheel, its real dependencies, the glue: `ReleaseFingerprint.folder`).
Each process appends what it answers to a pack of its own (`<writer>`: its pid and a random part), and reads the
others' packs of the folder: an index of where each key's last entry lies, built when the folder is first read and
brought up to date on a miss (at most once a second: another process may have answered meanwhile). One file per
process rather than one per answer: a cold default matrix writes some 3,000 answers, and creating that many files
cost it 0.3-0.4 s of system time on a calm ext4 disk and up to 3 s within minutes of a prune's mass deletion (the
kernel's `recently_deleted` scan per new inode). An entry whose key or sha256 does not match what it holds (a torn
write, a tampered file) is not trusted: it is not read again, and the job is asked again (its answer appended anew;
the bad bytes go with the folder's prune). Only what the release's code answered (a result, or its own refusal of
the job) is kept; a worker that hung, crashed, ran out of memory or could not start leaves nothing behind.

Answers of another fingerprint can never be read again by this code, so they are pruned (`ResultCache.prune`): the
first time a process reads or writes a spec's answers, a daemon thread removes that spec's folders of other
fingerprints but the most recently used (KEEP_FINGERPRINTS), and the folders of the older flat layout
(`<spec>/<key[:2]>/`). A folder is first renamed into `results/.trash/` and deleted there, so that no reader ever
sees half of one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.serving.real import fetch

# In-memory answers kept per process, most recently used last (a default matrix asks about 1,200 distinct jobs).
MEMORY_ENTRIES = 20_000
# Fingerprints of one spec kept on disk: the current one and the one used before it, so that a developer switching
# between two branches (or a branch and main) that change the glue finds both warm. A third is an edit ago, and one
# fingerprint of vllm@0.33.0 holds hundreds of MB.
KEEP_FINGERPRINTS = 2
FINGERPRINT_CHARS = 16  # of a folder's name: a key inside still hashes the whole fingerprint
_FINGERPRINT_NAME = re.compile(f"[0-9a-f]{{{FINGERPRINT_CHARS}}}")
_FLAT_LAYOUT_NAME = re.compile("[0-9a-f]{2}")  # results/<spec>/<key[:2]>/, before answers were kept by fingerprint
TRASH = ".trash"


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
class FingerprintFolder:
    """Where the answers of one spec made by one version of the code live: results/<spec>/<fingerprint>/."""

    spec: str  # engine@version, or a store's name (causes)
    fingerprint: str  # FINGERPRINT_CHARS hex digits

    @classmethod
    def of(cls, spec: str, code: dict) -> FingerprintFolder:
        """The folder of `spec`'s answers made by the code `code` describes (hashes, versions)."""
        return cls(spec, hashlib.sha256(_canonical(code)).hexdigest()[:FINGERPRINT_CHARS])


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

    @property
    def folder(self) -> FingerprintFolder:
        """The folder of the answers this fingerprint's code gives (the key's head: release, wheel, dependencies,
        glue)."""
        return _folder(self)


def _head(fingerprint: ReleaseFingerprint) -> dict:
    return {"release": fingerprint.spec, "wheel": fingerprint.wheel_sha256,
            "dependencies": list(fingerprint.dependencies), "glue": glue_fingerprint()}


@functools.lru_cache(maxsize=64)
def _head_digest(fingerprint: ReleaseFingerprint) -> Any:
    return hashlib.sha256(_canonical(_head(fingerprint))[:-1] + b',"job":')


@functools.lru_cache(maxsize=64)
def _folder(fingerprint: ReleaseFingerprint) -> FingerprintFolder:  # asked at every ask of a release
    return FingerprintFolder.of(fingerprint.spec, _head(fingerprint))


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


_KEY_HEAD = b'{"key":"'  # how every entry begins: a pack's lines are told apart by it


def _entry_head(key: str, sha256: str) -> bytes:
    return _KEY_HEAD + key.encode() + b'","sha256":"' + sha256.encode() + b'","reply":'


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


PACK_SUFFIX = ".pack"
RESCAN_S = 1.0  # a miss reads what other processes appended since, at most this often


def pack_entries(folder: Path) -> Iterator[tuple[str, Path, int, bytes]]:
    """Each whole entry of a fingerprint folder's packs: (its key, its pack, its offset there, its bytes without the
    newline), in each pack's order. A torn last line (a writer stopped mid-entry) is left out, and so is a line that
    is no entry."""
    try:
        packs = sorted(p for p in folder.iterdir() if p.name.endswith(PACK_SUFFIX))
    except OSError:
        return
    for pack in packs:
        try:
            data = pack.read_bytes()
        except OSError:
            continue
        for key, offset, length, _ in _entries_in(data):
            if key is not None:
                yield key, pack, offset, data[offset:offset + length]


def _entries_in(data: bytes) -> Iterator[tuple[str | None, int, int, int]]:
    """Each whole line of `data` (a pack's bytes, or its tail): the key its entry names (None for a line that is no
    entry: its head is not `_entry_head`'s), its offset and length in `data` (no newline), and where the next line
    starts. A last line without its newline yet is left out. The lines are not copied: a traced reply can be tens of
    KB."""
    start, head = 0, len(_KEY_HEAD)
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            return
        if end > start:
            key = None
            if data.startswith(_KEY_HEAD, start):
                close = data.find(b'"', start + head, end)
                if close > 0:
                    key = data[start + head:close].decode("ascii", "replace")
            yield key, start, end - start, end + 1
        start = end + 1


class _Packs:
    """One fingerprint folder's packs as this process sees them: where each key's last entry lies, as far as each
    pack was read, and the pack this process appends to (created with its first answer)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.index: dict[str, tuple[str, int, int]] = {}  # key -> (pack name, offset, length)
        self.read_to: dict[str, int] = {}  # pack name -> bytes indexed (up to its last whole line)
        self.read_at = float("-inf")  # when the packs were last read (time.monotonic)
        self.readers: dict[str, int] = {}  # pack name -> a descriptor it is read with
        self.own: int | None = None  # the descriptor of this process's pack (read and appended)
        self.own_name = ""
        self.own_size = 0
        self.own_seen_at = float("-inf")  # when this process's pack was last seen in the folder

    def find(self, key: str) -> tuple[str, int, int] | None:
        with self.lock:
            where = self.index.get(key)
            if where is None and time.monotonic() - self.read_at >= RESCAN_S:
                self._read_new()
                where = self.index.get(key)
            return where

    def _read_new(self) -> None:
        """Index what the folder's packs hold beyond what was read of them (this process's own is indexed as it is
        written)."""
        self.read_at = time.monotonic()
        try:
            entries = list(os.scandir(self.path))
        except OSError:
            return
        for entry in entries:
            name = entry.name
            if not name.endswith(PACK_SUFFIX) or name == self.own_name:
                continue
            start = self.read_to.get(name, 0)
            try:
                if entry.stat().st_size <= start:
                    continue
                with open(entry.path, "rb") as pack:
                    pack.seek(start)
                    data = pack.read()
            except OSError:
                continue
            for key, offset, length, after in _entries_in(data):
                if key is not None:
                    self.index[key] = (name, start + offset, length)
                self.read_to[name] = start + after

    def read(self, where: tuple[str, int, int]) -> bytes:
        name, offset, length = where
        with self.lock:
            fd = self.own if name == self.own_name else self.readers.get(name)
            if fd is None:
                try:
                    fd = self.readers[name] = os.open(os.path.join(self.path, name), os.O_RDONLY)
                except OSError:
                    return b""
        try:
            return os.pread(fd, length, offset)
        except OSError:
            return b""

    def forget(self, key: str, where: tuple[str, int, int]) -> None:
        """A rejected entry: not read again (a later one of the key replaces it)."""
        with self.lock:
            if self.index.get(key) == where:
                del self.index[key]

    def append(self, key: str, entry: bytes) -> None:
        with self.lock:
            now = time.monotonic()
            if self.own is not None and now - self.own_seen_at >= RESCAN_S:
                if not os.path.exists(os.path.join(self.path, self.own_name)):  # a prune took the folder
                    os.close(self.own)
                    self.own = None
                self.own_seen_at = now
            if self.own is None:
                self._open_own()
            assert self.own is not None
            end = os.fstat(self.own).st_size
            # Another hand cut or grew this pack (only this process appends to it): begin on a line of its own
            line = entry + b"\n" if end == self.own_size else b"\n" + entry + b"\n"
            written = os.write(self.own, line)
            if written != len(line):  # a full disk: the rest of this pack could not be told from the torn entry
                os.close(self.own)
                self.own = None
                return
            offset = end + len(line) - len(entry) - 1
            self.own_size = end + written
            self.index[key] = (self.own_name, offset, len(entry))

    def _open_own(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        self.own_name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}{PACK_SUFFIX}"
        self.own = os.open(os.path.join(self.path, self.own_name), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.own_size = 0
        self.own_seen_at = time.monotonic()


FLAT = "flat"  # how a prune names the flat layout's folders among those it removed


@dataclass(frozen=True)
class FolderSize:
    """The answers one fingerprint's folder of a spec holds (FLAT: the flat layout's folders together)."""

    fingerprint: str
    answers: int
    bytes: int


@dataclass(frozen=True)
class SpecReport:
    """One spec's answers on disk: what is kept, most recently used first, and what a prune removed."""

    spec: str
    current: str | None  # the fingerprint this code reads, when it can be told here
    kept: tuple[FolderSize, ...]
    removed: tuple[FolderSize, ...] = ()

    @property
    def answers(self) -> int:
        return sum(f.answers for f in self.kept)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.kept)


class ResultCache:
    """Answers by key: memory first, then the packs under `folder` (checked by hash on every read)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._root = str(folder)
        self.memory: OrderedDict[str, dict] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = self.rejected = 0
        self.used: set[FingerprintFolder] = set()  # by this process: its prunes keep them
        self.pruning: dict[str, threading.Thread] = {}  # spec -> the prune its first use started
        self._packs: dict[FingerprintFolder, _Packs] = {}

    def _packs_of(self, folder: FingerprintFolder) -> _Packs:
        packs = self._packs.get(folder)
        if packs is None:
            with self.lock:
                packs = self._packs.setdefault(
                    folder, _Packs(f"{self._root}{os.sep}{folder.spec}{os.sep}{folder.fingerprint}"))
        return packs

    def get(self, folder: FingerprintFolder, key: str) -> dict | None:
        with self.lock:
            reply = self.memory.get(key)
            if reply is not None:
                self.memory.move_to_end(key)
                self.hits += 1
                return reply
        self._use(folder)
        packs = self._packs_of(folder)
        where = packs.find(key)
        if where is None:
            self.misses += 1
            return None
        reply = _verified_reply(packs.read(where), key)
        if reply is None:
            self.rejected += 1
            self.misses += 1
            packs.forget(key, where)
            return None
        self._remember(key, reply)
        self.hits += 1
        return reply

    def holds_answers_of(self, folder: FingerprintFolder) -> bool:
        """Whether any answer of this fingerprint is stored (a warm release: a run asks its worker little or
        nothing). Answers of another fingerprint do not count: this code never reads them."""
        try:
            return any((self.folder / folder.spec / folder.fingerprint).iterdir())
        except OSError:
            return False

    def put(self, folder: FingerprintFolder, key: str, reply: dict) -> None:
        self._remember(key, reply)
        self._use(folder)
        try:
            self._packs_of(folder).append(key, _entry(key, _canonical(reply)))
        except OSError:
            pass  # a read-only or full cache only costs the next run a worker call

    def _use(self, folder: FingerprintFolder) -> None:
        """The first use of a folder in this process marks it recently used (its mtime: the prunes of other
        processes keep the most recently used fingerprints), and the first of its spec prunes the spec's other
        folders in a thread of its own, beside the asks (a prune may delete folders of thousands of files; one that
        the process's end stops half-way leaves its rest in the trash, emptied by the next prune)."""
        with self.lock:
            if folder in self.used:
                return
            self.used.add(folder)
            if folder.spec not in self.pruning:
                self.pruning[folder.spec] = threading.Thread(target=self.prune, args=(folder.spec,), daemon=True,
                                                             name=f"prune {folder.spec}")
                self.pruning[folder.spec].start()
        try:
            os.utime(self.folder / folder.spec / folder.fingerprint)
        except OSError:
            pass  # not written yet: its first write makes it

    def _remember(self, key: str, reply: dict) -> None:
        with self.lock:
            self.memory[key] = reply
            self.memory.move_to_end(key)
            while len(self.memory) > MEMORY_ENTRIES:
                self.memory.popitem(last=False)

    def clear_memory(self) -> None:
        with self.lock:
            self.memory.clear()

    def specs(self) -> list[str]:
        """The specs that have a folder here."""
        try:
            return sorted(p.name for p in self.folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return []

    def _folders(self, spec: str) -> tuple[list[str], list[str]]:
        """`spec`'s fingerprint folders, most recently used first, and its flat layout's folders."""
        dated, flat = [], []
        try:
            entries = list(os.scandir(self.folder / spec))
        except OSError:
            return [], []
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if _FINGERPRINT_NAME.fullmatch(entry.name):
                    dated.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
                elif _FLAT_LAYOUT_NAME.fullmatch(entry.name):
                    flat.append(entry.name)
            except OSError:  # renamed away meanwhile
                continue
        return [name for _, name in sorted(dated, reverse=True)], flat

    def prune(self, spec: str, current: str | None = None, keep: int = KEEP_FINGERPRINTS) -> list[str]:
        """Remove `spec`'s folders that no code in use reads: every fingerprint's but `current`'s, those this
        process used and the most recently used others (`keep` in all), and the flat layout's. The fingerprints
        removed (FLAT for the flat layout)."""
        with self.lock:
            kept = {f.fingerprint for f in self.used if f.spec == spec}
        if current is not None:
            kept.add(current)
        fingerprints, flat = self._folders(spec)
        others = [name for name in fingerprints if name not in kept]
        removed = [name for name in others[max(0, keep - len(kept)):] if self._discard(spec, name)]
        if [name for name in flat if self._discard(spec, name)]:
            removed.append(FLAT)
        self._empty_trash()
        return removed

    def _discard(self, spec: str, name: str) -> bool:
        """Rename results/<spec>/<name> into the trash (at once: a reader finds it whole or not at all), then
        delete it there. False when it is gone already (another process's prune)."""
        trash = self.folder / TRASH / f"{spec}-{name}-{uuid.uuid4().hex}"
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)
            (self.folder / spec / name).rename(trash)
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def _empty_trash(self) -> None:
        """What a prune that was stopped half-way (its process ended) left in the trash."""
        try:
            left = list((self.folder / TRASH).iterdir())
        except OSError:
            return
        for path in left:
            shutil.rmtree(path, ignore_errors=True)

    def report(self, spec: str, current: str | None = None, *, prune: bool = False,
               keep: int = KEEP_FINGERPRINTS) -> SpecReport:
        """What `spec`'s folders hold (answers and bytes per fingerprint), and what a prune then removed when
        asked for one."""
        fingerprints, flat = self._folders(spec)
        sizes = [_size(fingerprint, [self.folder / spec / fingerprint]) for fingerprint in fingerprints]
        if flat:
            sizes.append(_size(FLAT, [self.folder / spec / name for name in flat]))
        removed = set(self.prune(spec, current, keep)) if prune else set()
        return SpecReport(spec, current, tuple(s for s in sizes if s.fingerprint not in removed),
                          tuple(s for s in sizes if s.fingerprint in removed))


def _size(fingerprint: str, folders: list[Path]) -> FolderSize:
    """The distinct answers and the bytes of fingerprint folders' packs, or of older layouts' files (one entry each)."""
    keys: set[str] = set()
    size = 0
    for folder in folders:
        for path in folder.rglob("*"):
            try:
                if path.is_file():
                    size += path.stat().st_size
            except OSError:
                continue
            if path.suffix == ".json":
                keys.add(path.stem)
        keys.update(key for key, *_ in pack_entries(folder))
    return FolderSize(fingerprint, len(keys), size)


_CACHES: dict[Path, ResultCache] = {}
_CACHES_BY_SETTING: dict[tuple[str | None, Path], ResultCache] = {}  # asked at every ask and every render
_CACHES_LOCK = threading.Lock()


def result_cache() -> ResultCache:
    """The cache under the current engine cache folder (one per folder: tests point DRIFT_ENGINE_CACHE elsewhere), or
    in DRIFT_RESULT_CACHE_DIR (the bench's cold run: an empty cache beside the cached sources)."""
    setting = (os.environ.get("DRIFT_RESULT_CACHE_DIR") or None, fetch.cache_dir())
    cache = _CACHES_BY_SETTING.get(setting)
    if cache is not None:
        return cache
    folder = Path(setting[0] or setting[1] / "results")
    with _CACHES_LOCK:
        cache = _CACHES.get(folder)
        if cache is None:
            cache = _CACHES[folder] = ResultCache(folder)
        _CACHES_BY_SETTING[setting] = cache
        return cache


def persisted_results_enabled() -> bool:
    """`DRIFT_RESULT_CACHE=0` turns the persisted answers off (the bench's cold figure; a suspicious user)."""
    return os.environ.get("DRIFT_RESULT_CACHE", "1") != "0"
