"""Each visitor's own workspace (engine/workspace.py visitor_workspace): named by the hash of a key nobody else holds,
bounded in disk, expired when unused; the operator's workspace (the CLI's) is unchanged. The app's half (two browser
sessions, a reload) is in tests/test_app_isolation.py and tests/test_browser.py."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from engine.assets import resolve_asset
from engine.errors import ExplorerError
from engine.models import load_model
from engine.traces.store import TraceStore
from engine.uploads import UploadError
from engine.workspace import (
    VisitorLimits,
    Workspace,
    disk_used,
    expire_visitor_workspaces,
    mark_used,
    new_visitor_key,
    visitor_workspace,
)

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "traces"
DAY = 86400


@pytest.fixture(scope="module")
def template() -> bytes:
    spec = load_model("qwen3.5").spec
    return resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"]).data


def test_a_key_is_128_random_bits_and_its_hash_names_the_folder(tmp_path):
    keys = {new_visitor_key() for _ in range(100)}
    assert len(keys) == 100 and all(len(k) == 22 for k in keys)
    key = keys.pop()
    workspace = visitor_workspace(key, tmp_path)
    assert workspace.root == tmp_path / "visitors" / hashlib.sha256(key.encode()).hexdigest()[:32]
    assert not workspace.root.exists()  # made by the first upload, not by a visit
    assert workspace.visitor_limits == VisitorLimits()


@pytest.mark.parametrize("key", ["", "../../../../etc/passwd", "a" * 21, "a" * 23, "%2e%2e%2fxxxxxxxxxxxxxxxx",
                                 "aaaaaaaaaa/aaaaaaaaaaa", "aaaaaaaaaa.aaaaaaaaaaa", "ääääääääääääääääääääää", None])
def test_a_key_that_is_not_one_is_refused_before_any_path_is_made(tmp_path, key):
    with pytest.raises(ExplorerError) as caught:
        visitor_workspace(key, tmp_path)
    assert str(caught.value) == "a workspace key is 22 letters, digits, '-' and '_'"
    assert list(tmp_path.iterdir()) == []


def test_one_visitors_upload_and_trace_are_not_anothers_nor_the_operators(tmp_path, template):
    mine, theirs = visitor_workspace(new_visitor_key(), tmp_path), visitor_workspace(new_visitor_key(), tmp_path)
    upload = mine.add("qwen3.5", {"chat_template": ("mine.jinja", template)}, "mine")
    trace = TraceStore(mine.root, visitor_limits=mine.visitor_limits).add(
        "openai.jsonl", (SAMPLES / "openai.jsonl").read_bytes())
    assert [u.id for u in mine.list()] == [upload.id]
    assert [t.id for t in TraceStore(mine.root).list()[0]] == [trace.id]
    assert theirs.list().uploads == () and TraceStore(theirs.root).list() == ([], [])
    # The operator's workspace holds the visitors' folder, and lists neither it nor its uploads.
    operator = Workspace(tmp_path)
    assert operator.list().uploads == () and operator.list().skipped == ()
    assert TraceStore(tmp_path).list() == ([], [])


def test_the_same_key_is_the_same_workspace(tmp_path, template):
    key = new_visitor_key()
    upload = visitor_workspace(key, tmp_path).add("qwen3.5", {"chat_template": ("mine.jinja", template)}, "mine")
    assert [u.id for u in visitor_workspace(key, tmp_path).list()] == [upload.id]


def test_a_visitors_uploads_and_traces_share_one_cap(tmp_path, template, monkeypatch):
    monkeypatch.setenv("DRIFT_VISITOR_MAX_MB", "1")
    workspace = visitor_workspace(new_visitor_key(), tmp_path)
    workspace.add("qwen3.5", {"chat_template": ("mine.jinja", template)}, "mine")
    used = disk_used(workspace.root)
    trace = (SAMPLES / "vllm-0.33.0.log").read_bytes() * 7  # the same log seven times over: 1.2 MB
    assert used + len(trace) > 2**20 > used  # the template fits, the trace does not fit beside it
    with pytest.raises(UploadError) as caught:
        TraceStore(workspace.root, visitor_limits=workspace.visitor_limits).add("server.log", trace)
    assert str(caught.value) == (
        f"server.log ({len(trace) / 2**20:.1f} MB) was not stored: your workspace holds {used / 2**20:.1f} MB of the "
        "1 MB each visitor's uploads and traces may take (DRIFT_VISITOR_MAX_MB); remove an upload or a trace first")
    assert disk_used(workspace.root) == used  # nothing written
    # The operator's workspace (the CLI's) has no such cap.
    assert TraceStore(tmp_path).add("server.log", trace).size == len(trace)


def test_nothing_is_stored_when_the_disk_is_nearly_full(tmp_path, template):
    free_mb = int(os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize / 2**20)
    limits = VisitorLimits(min_free_mb=free_mb + 10_000)
    workspace = visitor_workspace(new_visitor_key(), tmp_path, limits=limits)
    with pytest.raises(UploadError) as caught:
        workspace.add("qwen3.5", {"chat_template": ("mine.jinja", template)}, "mine")
    assert str(caught.value).startswith(f"mine.jinja ({len(template) / 2**20:.1f} MB) was not stored: the server's "
                                        "disk has ")
    assert str(caught.value).endswith(f" MB free, and keeps {free_mb + 10_000} MB free (DRIFT_VISITOR_MIN_FREE_MB)")
    assert not workspace.root.exists()


def test_workspaces_unused_for_the_idle_days_are_deleted_and_the_others_kept(tmp_path, template):
    old_key, used_key, fresh_key = new_visitor_key(), new_visitor_key(), new_visitor_key()
    old, used, fresh = (visitor_workspace(k, tmp_path) for k in (old_key, used_key, fresh_key))
    for workspace in (old, used, fresh):
        workspace.add("qwen3.5", {"chat_template": ("mine.jinja", template)}, "mine")
    size = disk_used(old.root)
    eight_days_ago = time.time() - 8 * DAY
    for workspace in (old, used):
        os.utime(workspace.root, (eight_days_ago, eight_days_ago))
    mark_used(used)  # visited today: its stamp is newer than its folder
    assert (used.root / ".last-used").is_file() and not (old.root / ".last-used").exists()
    assert expire_visitor_workspaces(tmp_path) == (
        f"Deleted 1 visitor workspace unused for 7 days or more ({size / 2**20:.1f} MB) from {tmp_path / 'visitors'}.")
    assert not old.root.exists() and used.list().uploads and fresh.list().uploads
    assert sorted(p.name for p in (tmp_path / "visitors").iterdir()) == sorted([used.root.name, fresh.root.name])
    assert expire_visitor_workspaces(tmp_path) is None
    # The key of a deleted workspace opens an empty one.
    assert visitor_workspace(old_key, tmp_path).list().uploads == ()


@pytest.mark.parametrize("name,value", [("DRIFT_VISITOR_MAX_MB", "0"), ("DRIFT_VISITOR_IDLE_DAYS", "-1"),
                                        ("DRIFT_VISITOR_MIN_FREE_MB", "lots")])
def test_a_bad_setting_is_one_sentence(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ExplorerError) as caught:
        VisitorLimits.from_env()
    assert str(caught.value) == f"environment variable {name} must be a whole number greater than 0, got {value!r}"
