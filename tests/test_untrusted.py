"""What a visitor can store or link (issue 15), at the library level: each case is one of the issue's findings, with
its exact sentence. The page-level halves are in tests/test_app.py; the CLI's in tests/test_cli_hostile.py."""

from __future__ import annotations

import base64
import gc
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import tiktoken
from stored import replace_stored

from engine import sandbox
from engine.assets import resolve_asset
from engine.errors import AssetError, ExplorerError
from engine.models import load_model, model_ids
from engine.sandbox import RenderLimits, SandboxedRenderer
from engine.scenario import load_scenario, load_yaml
from engine.simulate import run_cell_with
from engine.tiktoken_tokenizer import TiktokenTokenizer
from engine.uploads import UploadError
from engine.workspace import Workspace

BASIC = [{"role": "user", "content": "What's the weather in Paris today?"}]
HANG_GUARD_S = 60.0
KIMI_RANKS = 163_584  # model_assets/kimi-k2.6/special_tokens.json base_rank_count


@pytest.fixture(scope="module")
def stock_files() -> dict[str, bytes]:
    spec = load_model("qwen3.5").spec
    return {role: resolve_asset(spec.id, spec.hub_repo, spec.assets[role]).data
            for role in ("chat_template", "tokenizer")}


def rank_table(without: bytes | None, total: int = KIMI_RANKS) -> bytes:
    """A complete, contiguous tiktoken rank table of Kimi's size (single bytes, then every pair, then triples),
    lacking the single byte `without`: it passes every line and rank check."""
    tokens = [bytes([b]) for b in range(256) if bytes([b]) != without]
    tokens += [bytes(pair) for pair in itertools.product(range(256), repeat=2)]
    tokens += [bytes(t) for t in itertools.islice(itertools.product(range(256), repeat=3), total - len(tokens))]
    return b"".join(base64.b64encode(t) + b" %d\n" % rank for rank, t in enumerate(tokens[:total]))


# 1 ------------------------------------------------------------------------------------------------------------
def test_a_rank_table_missing_a_single_byte_is_refused_and_a_stored_one_is_marked_not_a_panic(tmp_path):
    workspace = Workspace(tmp_path)
    with pytest.raises(UploadError) as caught:
        workspace.add("kimi-k2.6", {"tiktoken": ("tiktoken.model", rank_table(b"Z"))})
    assert str(caught.value) == ("tiktoken.model: the rank table lacks the single byte 0x5a ('Z'); a tiktoken table "
                                 "needs all 256, or text holding them cannot be encoded.")
    # One stored before this check: loading it is the same sentence, a cell shows it, nothing panics.
    good = rank_table(None)
    upload = workspace.add("kimi-k2.6", {"tiktoken": ("tiktoken.model", good)}, "mine")
    replace_stored(upload, "tiktoken", rank_table(b"Z"))
    with pytest.raises(AssetError) as caught:
        workspace.load_model(upload.id)
    assert str(caught.value).endswith(".model: the rank table lacks the single byte 0x5a ('Z'); a tiktoken table "
                                      "needs all 256, or text holding them cannot be encoded.")


def test_a_tiktoken_panic_while_encoding_is_an_asset_error():
    ranks = {bytes([b]): b for b in range(256) if b != ord("Z")}
    ranks = {token: rank for rank, token in enumerate(ranks)}
    encoding = tiktoken.Encoding(name="t", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={})
    tokenizer = TiktokenTokenizer(encoding, "hand-made table")
    assert tokenizer.encode("abc").ids == (96, 97, 98)  # ranks after "Z" moved down one
    with pytest.raises(AssetError) as caught:
        tokenizer.encode("Zebra")
    assert str(caught.value) == ('hand-made table cannot encode this text: tiktoken stopped with "no entry found for '
                                 'key"')


# 2 ------------------------------------------------------------------------------------------------------------
def test_labels_are_unique_per_base_model_even_when_a_store_holds_duplicates(tmp_path, stock_files):
    workspace = Workspace(tmp_path)
    source = stock_files["chat_template"]
    first = workspace.add("qwen3.5", {"chat_template": ("a.jinja", source)}, "custom")
    second = workspace.add("qwen3.5", {"chat_template": ("b.jinja", source + b"\n")}, "custom")
    other_base = workspace.add("qwen3.6", {"chat_template": ("a.jinja", source)}, "custom")
    assert (first.label, second.label, other_base.label) == ("custom", "custom-2", "custom")
    meta = json.loads((second.path / "meta.json").read_text())
    (second.path / "meta.json").write_text(json.dumps({**meta, "label": "custom"}))  # an older store did this
    labels = sorted(u.model_id for u in workspace.list())
    assert labels == ["qwen3.5+custom", f"qwen3.5+custom-{second.id[:8]}", "qwen3.6+custom"]


# 3 ------------------------------------------------------------------------------------------------------------
def test_renders_of_different_templates_do_not_queue_behind_a_looping_one():
    # The loop's limit leaves seconds for the other render under load; every second of it is waited out below.
    looping = SandboxedRenderer("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                model="qwen3.5+loop", source_path="loop.jinja", limits=RenderLimits(timeout_s=8.0))
    good = SandboxedRenderer("{% for m in messages %}{{ m.content }}{% endfor %}", model="qwen3.5+good",
                             source_path="good.jinja", limits=RenderLimits(timeout_s=20.0))
    good.render(BASIC, None, add_generation_prompt=False)  # the worker is up
    assert looping.worker_pid not in (None, good.worker_pid)
    outcome: list[str] = []
    stuck = threading.Thread(target=lambda: outcome.append(_error_of(looping)), daemon=True)
    stuck.start()
    # Once the looping render holds its own worker (its request is in, however loaded the machine is)
    deadline = time.monotonic() + HANG_GUARD_S
    while not _rendering(looping) and stuck.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _rendering(looping)
    # While the loop holds its own worker, the other template renders, without waiting for the time limit.
    assert good.render(BASIC, None, add_generation_prompt=False).text == "What's the weather in Paris today?"
    assert stuck.is_alive() and not outcome
    # The loop has shown that it holds only its own worker. Stopped, it waits out the caller's wall-clock limit
    # without spinning a core beside the other tests.
    os.kill(looping.worker_pid, signal.SIGSTOP)
    stuck.join(HANG_GUARD_S)
    assert outcome == ["loop.jinja for model qwen3.5+loop was stopped after 8.0 s (render time limit)"]


def _rendering(renderer: SandboxedRenderer) -> bool:
    """Whether a request of this renderer holds its worker now (the worker serves one request at a time)."""
    worker = sandbox._pool.get((renderer.limits.memory_mb, renderer._worker_key))
    return worker is not None and worker.lock.locked()


def _error_of(renderer: SandboxedRenderer) -> str:
    try:
        renderer.render(BASIC, None, add_generation_prompt=False)
    except ExplorerError as err:
        return str(err)
    return "rendered"


# 4 ------------------------------------------------------------------------------------------------------------
def test_a_read_only_workspace_refuses_uploads_and_removal(tmp_path, stock_files, monkeypatch):
    writable = Workspace(tmp_path)
    upload = writable.add("qwen3.5", {"chat_template": ("a.jinja", stock_files["chat_template"])}, "a",
                          uploader="alice")
    assert writable.get(upload.id).uploader == "alice"
    monkeypatch.setenv("DRIFT_WORKSPACE_READONLY", "1")
    shared = Workspace(tmp_path)
    assert shared.read_only
    with pytest.raises(ExplorerError) as caught:
        shared.add("qwen3.5", {"chat_template": ("b.jinja", stock_files["chat_template"] + b"\n")})
    assert str(caught.value) == (f"the workspace {tmp_path} is read-only (DRIFT_WORKSPACE_READONLY is set): "
                                 "uploading is turned off")
    with pytest.raises(ExplorerError) as caught:
        shared.remove(upload.id)
    assert str(caught.value).endswith("removing an upload is turned off")
    assert shared.list().uploads == (writable.get(upload.id),)


# 6 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario_id", ["../../x", "tools", "../scenarios/tool-call", "", "tool-call.yaml"])
def test_a_scenario_id_is_looked_up_never_used_as_a_path(scenario_id):
    with pytest.raises(ExplorerError) as caught:
        load_scenario(scenario_id)
    assert str(caught.value).startswith(f"unknown scenario {scenario_id!r}; known: args-serialization, ")


def test_a_yaml_file_elsewhere_on_disk_is_not_a_scenario(tmp_path):
    from engine.scenario import SCENARIOS_DIR

    outside = tmp_path / "planted.yaml"
    outside.write_text((SCENARIOS_DIR / "tool-call.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    relative = os.path.relpath(tmp_path / "planted", SCENARIOS_DIR)  # what a link or evidence could name
    with pytest.raises(ExplorerError) as caught:
        load_scenario(relative)
    # a long name is cut at 80 characters of its repr, wherever pytest puts tmp_path
    assert str(caught.value).startswith(f"unknown scenario {repr(relative)[:80]}; known: args-serialization, ")


def test_yaml_is_loaded_safely_under_size_and_alias_limits():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
    started = time.monotonic()
    with pytest.raises(ExplorerError) as caught:
        load_yaml(bomb, "bomb.yaml")
    assert str(caught.value) == "bomb.yaml is not usable YAML: it uses more than 32 aliases"
    assert time.monotonic() - started < HANG_GUARD_S
    with pytest.raises(ExplorerError) as caught:
        load_yaml("x: !!python/object/apply:os.system ['true']", "code.yaml")
    assert str(caught.value).startswith("code.yaml is not usable YAML: could not determine a constructor for the tag "
                                        "'tag:yaml.org,2002:python/object/apply:os.system'")
    with pytest.raises(ExplorerError) as caught:
        load_yaml("x: " + "y" * (1024 * 1024), "big.yaml")
    assert str(caught.value) == "big.yaml is 1,048,579 bytes, over the 1,048,576-byte limit for YAML files"
    assert load_yaml("a: &a [1]\nb: *a\n", "ok.yaml") == {"a": [1], "b": [1]}


# 7 and 13 -----------------------------------------------------------------------------------------------------
def test_a_damaged_meta_json_marks_only_its_upload(tmp_path, stock_files):
    workspace = Workspace(tmp_path)
    kept = workspace.add("qwen3.5", {"chat_template": ("a.jinja", stock_files["chat_template"])}, "kept")
    deep = tmp_path / "0123456789abcdef"
    deep.mkdir()
    (deep / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    unknown_base = workspace.add("qwen3.6", {"chat_template": ("a.jinja", stock_files["chat_template"])}, "b")
    meta = json.loads((unknown_base.path / "meta.json").read_text())
    (unknown_base.path / "meta.json").write_text(json.dumps({**meta, "base_model": "../../etc"}))
    listing = workspace.list()
    assert listing.uploads == (kept,)
    assert set(listing.skipped) == {
        f"upload 0123456789abcdef in {deep} is damaged and was skipped: meta.json is nested too deeply to be read",
        f"upload {unknown_base.id} in {unknown_base.path} is damaged and was skipped: meta.json names the base model "
        f"'../../etc', which is not one of {', '.join(model_ids())}",
    }


def test_the_workspace_tidies_interrupted_writes_summarises_junk_and_follows_no_link(tmp_path, stock_files):
    root = tmp_path / "workspace"
    workspace = Workspace(root)
    kept = workspace.add("qwen3.5", {"chat_template": ("a.jinja", stock_files["chat_template"])}, "kept")
    old = time.time() - 3600
    for n in range(3):
        staging = root / f".tmp-0123456789abcdef-{n:08x}"
        staging.mkdir()
        (staging / "part").write_bytes(b"x" * 1024 * 1024)
        os.utime(staging, (old, old))
    fresh = root / ".tmp-fedcba9876543210-00000000"  # a write that may be under way in another process
    fresh.mkdir()
    for n in range(2008):
        (root / f"junk-{n}.txt").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "00000000000000aa").symlink_to(kept.path)  # a link to an upload, or anywhere else
    (root / "00000000000000bb").symlink_to(outside)
    listing = workspace.list()
    assert listing.uploads == (kept,)
    assert listing.skipped == (
        f"4 entries in {root} are an upload or removal that was interrupted and are not used "
        "(.tmp-0123456789abcdef-00000000, .tmp-0123456789abcdef-00000001, .tmp-0123456789abcdef-00000002, "
        ".tmp-fedcba9876543210-00000000); the app removes them when it starts",
        f"2010 entries in {root} are not an upload folder and were skipped: 00000000000000aa (a symbolic link, never "
        "followed), 00000000000000bb (a symbolic link, never followed), junk-0.txt, junk-1.txt, junk-10.txt, and "
        "2005 more",
    )
    assert workspace.tidy() == (f"Removed 3 interrupted uploads or removals from {root} (3.0 MB): "
                                ".tmp-0123456789abcdef-00000000, .tmp-0123456789abcdef-00000001, "
                                ".tmp-0123456789abcdef-00000002.")
    assert fresh.is_dir() and workspace.tidy() is None
    with pytest.raises(UploadError) as caught:
        workspace.get("00000000000000bb")
    assert str(caught.value) == (f"upload 00000000000000bb in {root / '00000000000000bb'} is damaged and was skipped: "
                                 "its folder is a symbolic link, which is never followed")


def test_a_workspace_that_is_a_symlink_loop_says_so(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ExplorerError) as caught:
        Workspace(loop).list()
    assert str(caught.value) == f"the workspace {loop} cannot be read (Too many levels of symbolic links)"


# 10 -----------------------------------------------------------------------------------------------------------
def test_stored_tokenizers_are_shared_by_hash_and_loaded_models_are_bounded(tmp_path, stock_files, monkeypatch):
    from engine import workspace as workspace_module

    monkeypatch.setenv("DRIFT_WORKSPACE_LOADED_MODELS", "2")
    workspace = Workspace(tmp_path)
    tokenizer = ("tokenizer.json", stock_files["tokenizer"])
    uploads = [workspace.add("qwen3.5", {"chat_template": (f"{n}.jinja", stock_files["chat_template"] + b"\n" * n),
                                         "tokenizer": tokenizer}, f"t{n}") for n in range(3)]
    first, second = (workspace.load_model(u.id) for u in uploads[:2])
    assert first.tokenizer is second.tokenizer  # one tokenizer for the same file, however many uploads use it
    workspace.load_model(uploads[2].id)
    held = [key[1] for key in workspace_module._models]
    assert held == [uploads[1].id, uploads[2].id]
    del first, second
    gc.collect()
    assert len(workspace_module._tokenizers) == 1


def test_the_number_of_uploads_is_capped(tmp_path, stock_files, monkeypatch):
    monkeypatch.setenv("DRIFT_WORKSPACE_MAX_UPLOADS", "1")
    workspace = Workspace(tmp_path)
    workspace.add("qwen3.5", {"chat_template": ("a.jinja", stock_files["chat_template"])})
    with pytest.raises(UploadError) as caught:
        workspace.add("qwen3.5", {"chat_template": ("b.jinja", stock_files["chat_template"] + b"\n")})
    assert str(caught.value) == (f"the workspace {tmp_path} holds 1 uploads, the most it keeps "
                                 "(DRIFT_WORKSPACE_MAX_UPLOADS); remove one first")


# 15 -----------------------------------------------------------------------------------------------------------
def test_a_template_with_a_bom_is_refused_and_the_uploader_caps_at_our_limit(tmp_path, stock_files):
    with pytest.raises(UploadError) as caught:
        Workspace(tmp_path).add("qwen3.5", {"chat_template": ("bom.jinja", b"\xef\xbb\xbf" +
                                                               stock_files["chat_template"])})
    assert str(caught.value) == ("bom.jinja starts with a byte-order mark (U+FEFF), which would become the first "
                                 "character of every prompt: save it as UTF-8 without a BOM")
    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parent.parent / ".streamlit" / "config.toml").read_text())
    assert config["server"]["maxUploadSize"] == 50  # MB: the largest of our caps, so nothing bigger reaches us


def test_a_cell_of_a_stored_upload_that_fails_is_an_error_cell(tmp_path, stock_files):
    workspace = Workspace(tmp_path)
    upload = workspace.add("qwen3.5", {"chat_template": ("a.jinja", stock_files["chat_template"])}, "a")
    replace_stored(upload, "chat_template", b"{{ raise_exception('![x](http://example.invalid/p.png)') }}")
    cell = run_cell_with(workspace.load_model(upload.id), "tool-call", "raw", {})
    assert (cell.status, cell.note) == ("error", "a.jinja for model qwen3.5+a raised at line 1: "
                                                 "![x](http://example.invalid/p.png)")


def test_a_new_templates_worker_is_forked_from_the_zygote_as_this_processs_child():
    # Two templates of their own: each a worker of its own, both forked by the zygote (which made the imports once)
    # and both this process's children (clone with CLONE_PARENT), killed and waited for as any child.
    renderers = [SandboxedRenderer("{{ messages[0]['content'] }}" + suffix, model="qwen3.5",
                                   source_path=f"zygote{n}.jinja") for n, suffix in enumerate(("!", "?"))]
    texts = [r.render([{"role": "user", "content": "hi"}], None, add_generation_prompt=False, kwargs={})
             for r in renderers]
    assert [t.text for t in texts] == ["hi!", "hi?"]
    zygote = sandbox._ZYGOTE.proc
    assert zygote is not None and zygote.poll() is None
    workers = [sandbox._pool[(r.limits.memory_mb, r._worker_key)] for r in renderers]
    assert len({w.pid for w in workers}) == 2
    for worker in workers:
        status = Path(f"/proc/{worker.pid}/status").read_text()
        assert f"PPid:\t{os.getpid()}" in status
        assert Path(f"/proc/{worker.pid}/cmdline").read_bytes() == Path(f"/proc/{zygote.pid}/cmdline").read_bytes()
