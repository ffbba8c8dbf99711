"""Uploads kept on disk: validated first, named by content hash, written atomically, never lost by a crash.

The folder is `$DRIFT_WORKSPACE`, else `~/.drift-explorer/workspace` (`default_root()`); the app shows it.

    <upload id>/meta.json        label, base model, files (role, original name, sha256, size), created time
    <upload id>/<sha256>.<ext>   each uploaded file, named by the sha256 of its content
    .tmp-<id>-<random>/          an upload being written: every file and meta.json are written to temporary names,
                                 fsynced and renamed, then the whole folder is renamed to <upload id>

So an upload is either complete or absent: a crash leaves at most a `.tmp-*` folder, which `list()` reports and
never reads. The id is a hash of the base model and the files' hashes, so uploading the same files again gives
the same id (and returns the stored upload, label unchanged). Results are recomputed from these stored inputs,
so a restart loses nothing.

API:
    Workspace(root=None)            .root (a Path)
    .add(base_model, {role: (original name, bytes)}, label=None) -> Upload
                                    roles: chat_template, tokenizer_config, tokenizer, tiktoken (engine/uploads.py);
                                    raises UploadError (one sentence naming the file and the problem)
    .list() -> WorkspaceListing     .uploads (oldest first) and .skipped (one sentence per damaged or unfinished
                                    entry); iterating it yields the uploads
    .get(upload_id) -> Upload       .remove(upload_id): deletes that upload's folder and nothing else
    .load_model(upload_id, limits=None) -> engine.models.LoadedModel
                                    the base model with the uploaded template (rendered in engine/sandbox.py) and
                                    tokenizer; its id is "<base>+<label>" and asset_hashes hold the uploads' sha256
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ExplorerError
from engine.uploads import ROLES, UploadError, UploadLimits, parse_tokenizer_config, validate_upload

if TYPE_CHECKING:
    from engine.models import LoadedModel
    from engine.sandbox import RenderLimits

WORKSPACE_ENV = "DRIFT_WORKSPACE"
META = "meta.json"
_ID = re.compile(r"[0-9a-f]{16}")
_SUFFIX = {"chat_template": ".jinja", "tokenizer_config": ".json", "tokenizer": ".json", "tiktoken": ".model"}
_META_VERSION = 1


def default_root() -> Path:
    configured = os.environ.get(WORKSPACE_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".drift-explorer" / "workspace"


@dataclass(frozen=True)
class StoredFile:
    role: str
    name: str  # the original file name
    sha256: str
    size: int
    stored_as: str  # the file name inside the upload's folder

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Upload:
    id: str
    base_model: str
    label: str
    created: str  # ISO 8601, UTC
    files: tuple[StoredFile, ...]
    path: Path  # the upload's folder

    @property
    def model_id(self) -> str:
        return f"{self.base_model}+{self.label}"

    @property
    def original_names(self) -> dict[str, str]:
        return {f.role: f.name for f in self.files}

    def file(self, role: str) -> StoredFile | None:
        return next((f for f in self.files if f.role == role), None)


@dataclass(frozen=True)
class WorkspaceListing:
    uploads: tuple[Upload, ...]
    skipped: tuple[str, ...]  # one sentence per entry that was not read, saying why

    def __iter__(self) -> Iterator[Upload]:
        return iter(self.uploads)

    def __len__(self) -> int:
        return len(self.uploads)


_models: dict[tuple[str, str, RenderLimits | None], LoadedModel] = {}
_models_lock = threading.Lock()


class Workspace:
    def __init__(self, root: str | Path | None = None, *, upload_limits: UploadLimits | None = None) -> None:
        self.root = Path(root).expanduser() if root else default_root()
        self.upload_limits = upload_limits

    # ---- writing --------------------------------------------------------------------------------------------

    def add(self, base_model: str, files: dict[str, tuple[str, bytes]], label: str | None = None, *,
            render_limits: RenderLimits | None = None) -> Upload:
        """Validate and store one upload; the same base model and files give the same (already stored) upload."""
        validated = validate_upload(base_model, files, limits=self.upload_limits, render_limits=render_limits)
        upload_id = _upload_id(base_model, {f.role: f.sha256 for f in validated.files})
        target = self.root / upload_id
        if target.exists():
            try:
                return self._read(upload_id)
            except UploadError:
                pass  # a damaged copy of these very files: replaced below
        self._ensure_root()
        template_name = files.get("chat_template", files.get("tokenizer_config", ("", b"")))[0]
        stored = tuple(
            StoredFile(f.role, f.name, f.sha256, f.size, f.sha256 + _SUFFIX[f.role]) for f in validated.files
        )
        meta = {
            "version": _META_VERSION,
            "id": upload_id,
            "base_model": base_model,
            "label": _label(label, template_name, upload_id),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "files": [f.to_json() for f in stored],
        }
        staging = self.root / f".tmp-{upload_id}-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            for f in stored:
                _write_atomic(staging / f.stored_as, bytes(files[f.role][1]))
            _write_atomic(staging / META, json.dumps(meta, ensure_ascii=False, indent=2).encode("utf-8"))
            _fsync_dir(staging)
            self._publish(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return self._read(upload_id)

    def _publish(self, staging: Path, target: Path) -> None:
        if target.exists():
            # Only reached for a damaged entry of the same id: move it aside first so the swap stays atomic.
            aside = self.root / f".damaged-{target.name}-{secrets.token_hex(4)}"
            os.rename(target, aside)
            os.rename(staging, target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            try:
                os.rename(staging, target)
            except OSError:
                if not target.is_dir():
                    raise
                shutil.rmtree(staging, ignore_errors=True)  # another request stored the same upload first
        _fsync_dir(self.root)
        _forget(self.root, target.name)

    def remove(self, upload_id: str) -> None:
        """Delete one upload's folder; nothing else in the workspace is touched."""
        path = self._path(upload_id)
        if not path.is_dir():
            raise UploadError(f"no upload {upload_id!r} in {self.root}")
        # Renamed away first, so a crash while deleting leaves a `.removing-*` folder, never half an upload.
        doomed = self.root / f".removing-{upload_id}-{secrets.token_hex(4)}"
        os.rename(path, doomed)
        _forget(self.root, upload_id)
        shutil.rmtree(doomed, ignore_errors=True)

    # ---- reading --------------------------------------------------------------------------------------------

    def list(self) -> WorkspaceListing:
        """Every readable upload (oldest first), and a sentence for each entry skipped; never raises for content."""
        if not self.root.exists():
            return WorkspaceListing((), ())
        if not self.root.is_dir():
            raise ExplorerError(f"the workspace {self.root} is not a folder")
        uploads: list[Upload] = []
        skipped: list[str] = []
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if name.startswith(".tmp-"):
                skipped.append(f"{entry} is an upload that was interrupted while being written; it is not used "
                               "(delete it to reclaim the space)")
            elif name.startswith((".removing-", ".damaged-")):
                skipped.append(f"{entry} is an upload whose deletion was interrupted; it is not used (delete it)")
            elif name.startswith("."):
                continue
            elif not _ID.fullmatch(name) or not entry.is_dir():
                skipped.append(f"{entry} is not an upload folder; it was skipped")
            else:
                try:
                    uploads.append(self._read(name))
                except UploadError as err:
                    skipped.append(str(err))
        uploads.sort(key=lambda u: (u.created, u.id))
        return WorkspaceListing(tuple(uploads), tuple(skipped))

    def get(self, upload_id: str) -> Upload:
        return self._read(upload_id)

    def _path(self, upload_id: str) -> Path:
        if not isinstance(upload_id, str) or not _ID.fullmatch(upload_id):
            raise UploadError(f"no upload {upload_id!r} in {self.root}: an upload id is 16 hex digits")
        return self.root / upload_id

    def _read(self, upload_id: str) -> Upload:
        path = self._path(upload_id)
        if not path.is_dir():
            raise UploadError(f"no upload {upload_id!r} in {self.root}")
        meta_path = path / META

        def damaged(problem: str) -> UploadError:
            return UploadError(f"upload {upload_id} in {path} is damaged and was skipped: {problem}")

        try:
            raw = meta_path.read_bytes()
        except OSError as err:
            raise damaged(f"{META} cannot be read ({err.strerror or err})") from None
        try:
            meta = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise damaged(f"{META} is not UTF-8 (byte offset {err.start})") from None
        except json.JSONDecodeError as err:
            raise damaged(f"{META} is not valid JSON ({err.msg}, line {err.lineno}, column {err.colno})") from None
        try:
            files = tuple(StoredFile(**{k: entry[k] for k in StoredFile.__dataclass_fields__}) for entry in
                          meta["files"])
            upload = Upload(id=meta["id"], base_model=meta["base_model"], label=meta["label"],
                            created=meta["created"], files=files, path=path)
            fields_ok = all(isinstance(v, str) for v in (upload.id, upload.base_model, upload.label, upload.created))
        except (KeyError, TypeError) as err:
            raise damaged(f"{META} lacks or mistypes the field {err}") from None
        if not fields_ok or upload.id != upload_id:
            raise damaged(f"{META} does not describe upload {upload_id}")
        for f in files:
            if f.role not in ROLES or f.stored_as != f.sha256 + _SUFFIX[f.role]:
                raise damaged(f"{META} lists an unknown file {f.stored_as!r} for role {f.role!r}")
            try:
                size = (path / f.stored_as).stat().st_size
            except OSError:
                raise damaged(f"{f.name} ({f.role}) is missing") from None
            if size != f.size:
                raise damaged(f"{f.name} ({f.role}) has {size} bytes, {f.size} were stored")
        return upload

    def read_file(self, upload: Upload, role: str) -> bytes:
        """The stored bytes of one role, checked against their sha256."""
        stored = upload.file(role)
        if stored is None:
            raise UploadError(f"upload {upload.id} has no {role} file")
        data = (upload.path / stored.stored_as).read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != stored.sha256:
            raise UploadError(f"upload {upload.id}: {stored.name} ({role}) is damaged: its sha256 is {actual}, "
                              f"{stored.sha256} was stored")
        return data

    # ---- using ----------------------------------------------------------------------------------------------

    def load_model(self, upload_id: str, limits: RenderLimits | None = None) -> LoadedModel:
        """The base model with this upload's template and tokenizer (cached per process; uploads never change)."""
        key = (str(self.root.resolve()), upload_id, limits)
        with _models_lock:
            cached = _models.get(key)
        if cached is not None:
            return cached
        model = self._build_model(self.get(upload_id), limits)
        with _models_lock:
            _models[key] = model
        return model

    def _build_model(self, upload: Upload, limits: RenderLimits | None) -> LoadedModel:
        from engine.models import load_model, special_token_vars
        from engine.render.cache import CachedRenderer
        from engine.sandbox import SandboxedRenderer
        from engine.tokenize import HFTokenizer

        base = load_model(upload.base_model)
        model_id = upload.model_id
        hashes = dict(base.asset_hashes)
        sources = dict(base.asset_sources)

        def note(key: str, stored: StoredFile) -> None:
            hashes[key] = stored.sha256
            sources[key] = f"upload {upload.id}: {stored.name}"

        # transformers passes the tokenizer config's special tokens to every render: the base model's, then the
        # uploaded config's (engine/check.py's custom renderer forgets the base model's).
        special_tokens = special_token_vars(base.spec)
        source: str | None = None
        source_name = ""
        config = upload.file("tokenizer_config")
        if config is not None:
            config_template, config_tokens = parse_tokenizer_config(self.read_file(upload, "tokenizer_config"),
                                                                    config.name)
            special_tokens.update(config_tokens)
            note("tokenizer_config", config)
            if config_template is not None:
                source, source_name = config_template, f"{config.name} (chat_template)"
        template = upload.file("chat_template")
        if template is not None:
            source, source_name = self.read_file(upload, "chat_template").decode("utf-8"), template.name
            note("chat_template", template)
        renderer = base.renderer
        if source is not None:
            # Cached like the stock models' renderers (engine/render/cache.py): a repeat skips the worker round trip.
            renderer = CachedRenderer(SandboxedRenderer(source, model=model_id, source_path=source_name,
                                                        special_tokens=special_tokens, limits=limits))
            hashes.pop("encoder", None)
            sources.pop("encoder", None)
            if template is None:
                hashes.pop("chat_template", None)
                sources.pop("chat_template", None)

        tokenizer, unavailable = base.tokenizer, base.tokenizer_unavailable
        tokenizer_file = upload.file("tokenizer")
        tiktoken_file = upload.file("tiktoken")
        if tokenizer_file is not None:
            text = self.read_file(upload, "tokenizer").decode("utf-8")
            tokenizer = HFTokenizer(text, name=f"{model_id} tokenizer.json ({tokenizer_file.sha256[:12]})")
            unavailable = None
            note("tokenizer", tokenizer_file)
        elif tiktoken_file is not None:
            from engine.tiktoken_tokenizer import load_kimi

            tokenizer = load_kimi(upload.path / tiktoken_file.stored_as, expected_sha256=tiktoken_file.sha256)
            unavailable = None
            note("tokenizer", tiktoken_file)
        spec = dataclasses.replace(base.spec, id=model_id, display_name=f"{base.spec.display_name} + {upload.label}")
        return dataclasses.replace(base, spec=spec, renderer=renderer, tokenizer=tokenizer,
                                   tokenizer_unavailable=unavailable, asset_hashes=hashes, asset_sources=sources)

    def _ensure_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ExplorerError(f"the workspace {self.root} is not a folder") from None


def _upload_id(base_model: str, hashes: dict[str, str]) -> str:
    material = json.dumps({"base_model": base_model, "files": sorted(hashes.items())}, sort_keys=True)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def _label(label: str | None, template_name: str, upload_id: str) -> str:
    # The label becomes part of a model id ("qwen3.5+mine") and of URLs: keep it to a safe alphabet.
    for candidate in (label, Path(template_name).stem if template_name else None):
        cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", candidate or "").strip("-.")[:40]
        if cleaned:
            return cleaned
    return f"upload-{upload_id[:8]}"


def _write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    try:
        with open(temporary, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    # Makes the renames inside `path` durable; not every platform can open a folder.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _forget(root: Path, upload_id: str) -> None:
    prefix = str(root.resolve())
    with _models_lock:
        for key in [k for k in _models if k[0] == prefix and k[1] == upload_id]:
            del _models[key]
