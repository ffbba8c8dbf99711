"""Uploads kept on disk: validated first, named by content hash, written atomically, never lost by a crash.

The folder is `$DRIFT_WORKSPACE`, else `~/.drift-explorer/workspace` (`default_root()`); the app shows it.

    <upload id>/meta.json        label, base model, files (role, original name, sha256, size), created time
    <upload id>/<sha256>.<ext>   each uploaded file, named by the sha256 of its content
    .tmp-<id>-<random>/          an upload being written: every file and meta.json are written to temporary names,
                                 fsynced and renamed, then the whole folder is renamed to <upload id>

So an upload is either complete or absent: a crash leaves at most a `.tmp-*` folder, which `list()` never reads
and `tidy()` removes once it is a minute old (the app runs it on the operator's workspace when it starts, on a
visitor's when their Custom templates page opens). The id is a hash of the base model and the files' hashes, so
uploading the same files again gives the same id (and returns the stored upload, label unchanged). Results are
recomputed from these stored inputs, so a restart loses nothing.

That folder is the operator's workspace (the CLI's; the app shows its uploads to every visitor, read-only). What a
visitor uploads through the app goes to a workspace of their own, `visitor_workspace(key)`:

    visitors/<32 hex digits of sha256(key)>/     laid out as above (uploads, traces/), plus `.last-used`

The key is a capability (`new_visitor_key()`: 128 random bits) that the app keeps in the page's link; the folder is
named by its hash, so a key is never a path. A visitor's workspace holds at most DRIFT_VISITOR_MAX_MB of uploads and
traces; one unused for DRIFT_VISITOR_IDLE_DAYS is deleted by `expire_visitor_workspaces()`.

The operator's settings (environment variables; the page only shows them):

| setting | default | env var |
|---|---|---|
| the folder | `~/.drift-explorer/workspace` | `DRIFT_WORKSPACE` |
| read-only: no upload or removal through the app (a shared deployment) | off | `DRIFT_WORKSPACE_READONLY=1` |
| uploads kept at most | 200 | `DRIFT_WORKSPACE_MAX_UPLOADS` |
| uploaded models kept loaded (tokenizers shared by sha256) | 4 | `DRIFT_WORKSPACE_LOADED_MODELS` |
| uploads and traces of one visitor's workspace, in all | 200 MB | `DRIFT_VISITOR_MAX_MB` |
| a visitor's workspace unused this long is deleted | 7 days | `DRIFT_VISITOR_IDLE_DAYS` |
| nothing of a visitor's is stored while the disk has less free than | 1024 MB | `DRIFT_VISITOR_MIN_FREE_MB` |

Labels are unique per base model (a second "custom" for qwen3.5 becomes "custom-2"), so every column has its own
name. Entries that are not uploads are summed up in one sentence; a symbolic link is never followed; a `meta.json`
that is not JSON, nested too deep, or names an unknown base model marks that upload damaged, with its sentence.

API:
    Workspace(root=None, read_only=None, visitor_limits=None)
                                    .root (a Path), .read_only (from DRIFT_WORKSPACE_READONLY unless given);
                                    visitor_limits: the disk bounds of a visitor's workspace (None: the operator's)
    visitor_workspace(key, root=None) -> Workspace
                                    the workspace of the visitor holding `key`; ExplorerError for a key that is
                                    not one new_visitor_key() makes
    expire_visitor_workspaces(root=None) -> str | None
                                    deletes the visitor workspaces unused for DRIFT_VISITOR_IDLE_DAYS; one sentence
    check_room(folder, adding, what, limits)
                                    UploadError when `adding` bytes would not fit in a visitor's workspace
    .add(base_model, {role: (original name, bytes)}, label=None, uploader="") -> Upload
                                    roles: chat_template, tokenizer_config, tokenizer, tiktoken (engine/uploads.py);
                                    raises UploadError (one sentence naming the file and the problem)
    .list() -> WorkspaceListing     .uploads (oldest first) and .skipped (one sentence per damaged or unfinished
                                    entry); iterating it yields the uploads
    .get(upload_id) -> Upload       .remove(upload_id): deletes that upload's folder and nothing else
    .tidy() -> str | None           removes interrupted writes and deletions; one sentence saying what it removed
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
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ExplorerError
from engine.uploads import ROLES, UploadError, UploadLimits, parse_tokenizer_config, validate_upload

if TYPE_CHECKING:
    from engine.models import LoadedModel
    from engine.sandbox import RenderLimits

WORKSPACE_ENV = "DRIFT_WORKSPACE"
READ_ONLY_ENV = "DRIFT_WORKSPACE_READONLY"
MAX_UPLOADS_ENV = "DRIFT_WORKSPACE_MAX_UPLOADS"
LOADED_MODELS_ENV = "DRIFT_WORKSPACE_LOADED_MODELS"
META = "meta.json"
_ID = re.compile(r"[0-9a-f]{16}")
VISITORS = "visitors"  # <operator workspace>/visitors/<hash of a key>: the visitors' own workspaces
NOT_UPLOADS = frozenset({"traces", VISITORS})  # the workspace's other folders (engine/traces/store.py's, visitors')
VISITOR_KEY = re.compile(r"[A-Za-z0-9_-]{22}")  # secrets.token_urlsafe(16): 128 random bits
LAST_USED = ".last-used"
_MB = 1024 * 1024
_SUFFIX = {"chat_template": ".jinja", "tokenizer_config": ".json", "tokenizer": ".json", "tiktoken": ".model"}
_META_VERSION = 1


def default_root() -> Path:
    configured = os.environ.get(WORKSPACE_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".drift-explorer" / "workspace"


def read_only_setting() -> bool:
    return os.environ.get(READ_ONLY_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _count_setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ExplorerError(f"environment variable {name} must be a whole number greater than 0, got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class VisitorLimits:
    """The bounds on one visitor's workspace (module docstring: the settings)."""

    max_mb: int = 200
    idle_days: int = 7
    min_free_mb: int = 1024

    @classmethod
    def from_env(cls) -> VisitorLimits:
        from engine.sandbox import env_overrides

        values = env_overrides(cls, "DRIFT_VISITOR_")
        for name, value in values.items():
            if value <= 0:
                variable = f"DRIFT_VISITOR_{name.upper()}"
                raise ExplorerError(f"environment variable {variable} must be a whole number greater than 0, got "
                                    f"{os.environ[variable]!r}")
        return cls(**values)


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
    uploader: str = ""  # who uploaded it, as the app knew them (empty: unknown)

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


# Loaded uploaded models, least recently used first (at most DRIFT_WORKSPACE_LOADED_MODELS); their tokenizers by
# sha256, shared and held only while a loaded model holds them.
_models: OrderedDict[tuple[str, str, RenderLimits | None], LoadedModel] = OrderedDict()
_tokenizers: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
_models_lock = threading.Lock()
_TIDY_AGE_S = 60.0  # younger staging folders may belong to a write under way in another process


class Workspace:
    def __init__(self, root: str | Path | None = None, *, upload_limits: UploadLimits | None = None,
                 read_only: bool | None = None, visitor_limits: VisitorLimits | None = None) -> None:
        self.root = Path(root).expanduser() if root else default_root()
        self.upload_limits = upload_limits
        self.read_only = read_only_setting() if read_only is None else read_only
        self.visitor_limits = visitor_limits  # None: the operator's workspace, bounded by the upload count only

    def _writable(self, doing: str) -> None:
        if self.read_only:
            raise ExplorerError(f"the workspace {self.root} is read-only ({READ_ONLY_ENV} is set): {doing} is "
                                "turned off")

    # ---- writing --------------------------------------------------------------------------------------------

    def add(self, base_model: str, files: dict[str, tuple[str, bytes]], label: str | None = None, *,
            render_limits: RenderLimits | None = None, uploader: str = "") -> Upload:
        """Validate and store one upload; the same base model and files give the same (already stored) upload."""
        self._writable("uploading")
        validated = validate_upload(base_model, files, limits=self.upload_limits, render_limits=render_limits)
        upload_id = _upload_id(base_model, {f.role: f.sha256 for f in validated.files})
        target = self.root / upload_id
        if target.exists():
            try:
                return self._read(upload_id)
            except UploadError:
                pass  # a damaged copy of these very files: replaced below
        check_room(self.root, sum(f.size for f in validated.files), " and ".join(f.name for f in validated.files),
                   self.visitor_limits)
        self._ensure_root()
        listing = self.list()
        most = _count_setting(MAX_UPLOADS_ENV, 200)
        if len(listing.uploads) >= most:
            raise UploadError(f"the workspace {self.root} holds {len(listing.uploads)} uploads, the most it keeps "
                              f"({MAX_UPLOADS_ENV}); remove one first")
        template_name = files.get("chat_template", files.get("tokenizer_config", ("", b"")))[0]
        taken = {u.label for u in listing.uploads if u.base_model == base_model}
        wanted = _label(label, template_name, upload_id)
        unique = next(c for c in (wanted, *(f"{wanted[:36]}-{n}" for n in range(2, 10_000))) if c not in taken)
        stored = tuple(
            StoredFile(f.role, f.name, f.sha256, f.size, f.sha256 + _SUFFIX[f.role]) for f in validated.files
        )
        meta = {
            "version": _META_VERSION,
            "id": upload_id,
            "base_model": base_model,
            "label": unique,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "uploader": uploader[:200],
            "files": [f.to_json() for f in stored],
        }
        staging = self.root / f".tmp-{upload_id}-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            for f in stored:
                write_atomic(staging / f.stored_as, bytes(files[f.role][1]))
            write_atomic(staging / META, json.dumps(meta, ensure_ascii=False, indent=2).encode("utf-8"))
            fsync_dir(staging)
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
        fsync_dir(self.root)
        _forget(self.root, target.name)

    def remove(self, upload_id: str) -> None:
        """Delete one upload's folder; nothing else in the workspace is touched."""
        self._writable("removing an upload")
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
        """Every readable upload (oldest first), and a sentence for each damaged upload plus one for all the other
        entries skipped; never raises for content."""
        try:
            try:
                self.root.stat()
            except FileNotFoundError:
                return WorkspaceListing((), ())
            if not self.root.is_dir():
                raise ExplorerError(f"the workspace {self.root} is not a folder")
            entries = sorted(self.root.iterdir())
        except OSError as err:
            raise ExplorerError(f"the workspace {self.root} cannot be read ({err.strerror or err})") from None
        uploads: list[Upload] = []
        skipped: list[str] = []
        unfinished: list[str] = []
        junk: list[str] = []
        for entry in entries:
            name = entry.name
            if name.startswith((".tmp-", ".removing-", ".damaged-")):
                unfinished.append(name)
            elif name.startswith("."):
                continue
            elif entry.is_symlink():
                junk.append(f"{name} (a symbolic link, never followed)")
            elif name in NOT_UPLOADS and entry.is_dir():
                continue
            elif not _ID.fullmatch(name) or not entry.is_dir():
                junk.append(name)
            else:
                try:
                    uploads.append(self._read(name))
                except UploadError as err:
                    skipped.append(str(err))
        if unfinished:
            skipped.insert(0, f"{_count(unfinished, 'entry', 'entries')} in {self.root} {_are(unfinished)} an upload "
                           f"or removal that was interrupted and {_are(unfinished)} not used ({_some(unfinished)}); "
                           "the app removes them when it starts")
        if junk:
            skipped.append(f"{_count(junk, 'entry', 'entries')} in {self.root} {_are(junk)} not an upload folder and "
                           f"{_are(junk, 'was', 'were')} skipped: {_some(junk)}")
        uploads.sort(key=lambda u: (u.created, u.id))
        return WorkspaceListing(tuple(_unique_labels(uploads)), tuple(skipped))

    def tidy(self) -> str | None:
        """Remove interrupted writes and removals (`.tmp-*`, `.removing-*`, `.damaged-*` at least a minute old);
        one sentence saying what was removed, None when nothing was."""
        try:
            entries = sorted(self.root.iterdir()) if self.root.is_dir() and not self.read_only else []
        except OSError:
            return None
        removed: list[str] = []
        size = 0
        now = time.time()
        for entry in entries:
            try:
                if not entry.name.startswith((".tmp-", ".removing-", ".damaged-")) or entry.is_symlink() \
                        or now - entry.lstat().st_mtime < _TIDY_AGE_S:
                    continue
                size += sum(p.lstat().st_size for p in entry.rglob("*") if not p.is_symlink())
            except OSError:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed.append(entry.name)
        if not removed:
            return None
        return (f"Removed {_count(removed, 'interrupted upload or removal', 'interrupted uploads or removals')} from "
                f"{self.root} ({size / (1024 * 1024):.1f} MB): {_some(removed)}.")

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

        if path.is_symlink():
            raise damaged("its folder is a symbolic link, which is never followed")
        try:
            if meta_path.is_symlink():
                raise damaged(f"{META} is a symbolic link, which is never followed")
            raw = meta_path.read_bytes()
        except OSError as err:
            raise damaged(f"{META} cannot be read ({err.strerror or err})") from None
        try:
            meta = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise damaged(f"{META} is not UTF-8 (byte offset {err.start})") from None
        except json.JSONDecodeError as err:
            raise damaged(f"{META} is not valid JSON ({err.msg}, line {err.lineno}, column {err.colno})") from None
        except RecursionError:
            raise damaged(f"{META} is nested too deeply to be read") from None
        try:
            files = tuple(StoredFile(**{k: entry[k] for k in StoredFile.__dataclass_fields__}) for entry in
                          meta["files"])
            upload = Upload(id=meta["id"], base_model=meta["base_model"], label=meta["label"],
                            created=meta["created"], files=files, path=path, uploader=meta.get("uploader", ""))
            fields_ok = all(isinstance(v, str) for v in (upload.id, upload.base_model, upload.label, upload.created,
                                                        upload.uploader))
            fields_ok = fields_ok and all(isinstance(f.name, str) and isinstance(f.size, int) for f in files)
        except (KeyError, TypeError, AttributeError) as err:
            raise damaged(f"{META} lacks or mistypes the field {err}") from None
        if not fields_ok or upload.id != upload_id:
            raise damaged(f"{META} does not describe upload {upload_id}")
        from engine.models import model_ids

        if upload.base_model not in model_ids():
            raise damaged(f"{META} names the base model {upload.base_model[:60]!r}, which is not one of "
                          f"{', '.join(model_ids())}")
        if _label(upload.label, "", upload_id) != upload.label:
            raise damaged(f"{META} holds the label {upload.label[:60]!r}, which is not letters, digits, '.', '_' "
                          "and '-'")
        for f in files:
            if f.role not in ROLES or f.stored_as != f.sha256 + _SUFFIX[f.role]:
                raise damaged(f"{META} lists an unknown file {f.stored_as!r} for role {f.role!r}")
            try:
                if (path / f.stored_as).is_symlink():
                    raise OSError("a symbolic link")
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
                _models.move_to_end(key)
                return cached
        model = self._build_model(self.get(upload_id), limits)
        most = _count_setting(LOADED_MODELS_ENV, 4)
        with _models_lock:
            _models[key] = model
            while len(_models) > most:
                _models.popitem(last=False)
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
            tokenizer = _shared_tokenizer(tokenizer_file.sha256, lambda: HFTokenizer(
                self.read_file(upload, "tokenizer").decode("utf-8"),
                name=f"uploaded tokenizer.json ({tokenizer_file.sha256[:12]})", source_sha256=tokenizer_file.sha256))
            unavailable = None
            note("tokenizer", tokenizer_file)
        elif tiktoken_file is not None:
            from engine.tiktoken_tokenizer import load_kimi

            tokenizer = _shared_tokenizer(tiktoken_file.sha256, lambda: load_kimi(
                upload.path / tiktoken_file.stored_as, expected_sha256=tiktoken_file.sha256))
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


def new_visitor_key() -> str:
    """A visitor's key: 128 random bits, URL-safe (the app keeps it in the page's link)."""
    return secrets.token_urlsafe(16)


def visitor_key_problem(key: object) -> str | None:
    """Why `key` is not a visitor's key (a link's parameter is anybody's text), or None."""
    if isinstance(key, str) and VISITOR_KEY.fullmatch(key):
        return None
    return "a workspace key is 22 letters, digits, '-' and '_'"


def visitor_workspace(key: str, root: str | Path | None = None, *, limits: VisitorLimits | None = None,
                      read_only: bool | None = None) -> Workspace:
    """The private workspace of the visitor holding `key`: <root>/visitors/<32 hex digits of its sha256>, created by
    the first upload. The key is never a path: its hash names the folder."""
    problem = visitor_key_problem(key)
    if problem is not None:
        raise ExplorerError(problem)
    base = Path(root).expanduser() if root else default_root()
    folder = base / VISITORS / hashlib.sha256(key.encode("ascii")).hexdigest()[:32]
    return Workspace(folder, read_only=read_only, visitor_limits=limits or VisitorLimits.from_env())


def mark_used(workspace: Workspace) -> None:
    """Stamp a visitor's workspace as used now (its `.last-used` file), so that it is not expired while visited;
    a workspace nothing was stored in yet has no folder, and gets none here."""
    stamp = workspace.root / LAST_USED
    try:
        if workspace.root.is_dir() and time.time() - _mtime(stamp, 0.0) > 60:
            stamp.touch()
    except OSError:
        pass  # a stamp that cannot be written only makes the workspace look older


def _mtime(path: Path, missing: float) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return missing


def expire_visitor_workspaces(root: str | Path | None = None, limits: VisitorLimits | None = None,
                              now: float | None = None) -> str | None:
    """Delete every visitor workspace unused for DRIFT_VISITOR_IDLE_DAYS (by its `.last-used` stamp, else the
    folder's own time); one sentence saying how many and how much, None when none was."""
    limits = limits or VisitorLimits.from_env()
    folder = (Path(root).expanduser() if root else default_root()) / VISITORS
    cutoff = (time.time() if now is None else now) - limits.idle_days * 86400
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return None
    removed, size = 0, 0
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue
        if entry.name.startswith(".expired-"):  # an earlier deletion that was interrupted
            shutil.rmtree(entry, ignore_errors=True)
            continue
        if max(_mtime(entry / LAST_USED, 0.0), _mtime(entry, 0.0)) >= cutoff:
            continue
        used = disk_used(entry)
        doomed = folder / f".expired-{entry.name}-{secrets.token_hex(4)}"
        try:
            os.rename(entry, doomed)  # out of reach at once: a visit meanwhile finds an empty workspace
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed, size = removed + 1, size + used
    if not removed:
        return None
    return (f"Deleted {removed} visitor workspace{'s' if removed > 1 else ''} unused for "
            f"{limits.idle_days} days or more ({size / _MB:.1f} MB) from {folder}.")


def disk_used(folder: Path) -> int:
    """Bytes in the regular files under `folder` (symbolic links are not followed)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            info = path.lstat()
        except OSError:
            continue
        if not path.is_symlink() and path.is_file():
            total += info.st_size
    return total


def check_room(folder: Path, adding: int, what: str, limits: VisitorLimits | None) -> None:
    """Refuse to store `adding` bytes more in the visitor workspace `folder` when that would pass its cap or leave
    the disk with less than DRIFT_VISITOR_MIN_FREE_MB; one sentence naming the files. The operator's workspace
    (limits None) is not bounded here."""
    if limits is None:
        return
    used = disk_used(folder) if folder.is_dir() else 0
    if used + adding > limits.max_mb * _MB:
        raise UploadError(f"{what} ({adding / _MB:.1f} MB) was not stored: your workspace holds {used / _MB:.1f} MB "
                          f"of the {limits.max_mb} MB each visitor's uploads and traces may take "
                          "(DRIFT_VISITOR_MAX_MB); remove an upload or a trace first")
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free - adding < limits.min_free_mb * _MB:
        raise UploadError(f"{what} ({adding / _MB:.1f} MB) was not stored: the server's disk has "
                          f"{free / _MB:.0f} MB free, and keeps {limits.min_free_mb} MB free "
                          "(DRIFT_VISITOR_MIN_FREE_MB)")


def _shared_tokenizer(sha256: str, load: Callable[[], Any]) -> Any:
    """One tokenizer object per file content, however many uploads use it; freed with the last model holding it."""
    with _models_lock:
        tokenizer = _tokenizers.get(sha256)
    if tokenizer is None:
        tokenizer = load()
        with _models_lock:
            tokenizer = _tokenizers.setdefault(sha256, tokenizer)
    return tokenizer


def _unique_labels(uploads: list[Upload]) -> list[Upload]:
    """Labels made unique per base model (older stores, or meta.json edited by hand): a later duplicate gets its id."""
    seen: set[tuple[str, str]] = set()
    out = []
    for upload in uploads:
        if (upload.base_model, upload.label) in seen:
            upload = dataclasses.replace(upload, label=f"{upload.label}-{upload.id[:8]}")
        seen.add((upload.base_model, upload.label))
        out.append(upload)
    return out


def _count(items: list, one: str, many: str) -> str:
    return f"{len(items)} {one if len(items) == 1 else many}"


def _are(items: list, singular: str = "is", plural: str = "are") -> str:
    return singular if len(items) == 1 else plural


def _some(names: list[str], shown: int = 5) -> str:
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


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


def write_atomic(path: Path, data: bytes) -> None:
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


def fsync_dir(path: Path) -> None:
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
