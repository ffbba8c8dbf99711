"""The persisted result cache of the real backend (engine/serving/real/results.py): a release's answer is read back
instead of asked again, under a key naming the release, its glue and the whole job; a corrupt or tampered entry is
detected by its hash and asked again; a failed worker leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_release as need

from engine.serving.real import backend
from engine.serving.real.results import FingerprintFolder, ResultCache, pack_entries, release_fingerprint

pytestmark = pytest.mark.real_engine

QWEN_VOCAB = {"<think>": 151667, "</think>": 151668, "<tool_call>": 151657, "</tool_call>": 151658}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
OUTPUT = ("<think>\nhmm\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
          "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultCache:
    """A result cache of its own in tmp_path; the release's sources stay in the shared engine cache."""
    fresh = ResultCache(tmp_path / "results")
    monkeypatch.setattr(backend, "result_cache", lambda: fresh)
    monkeypatch.delenv("DRIFT_RESULT_CACHE", raising=False)
    return fresh


def _parse(engine: backend.RealEngine):
    return engine.parse(OUTPUT, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=TOOLS,
                        added_tokens=QWEN_VOCAB)


def _answer(result) -> tuple:
    """What the release parsed, without its call ids (SGLang draws them from uuid4 at every ask)."""
    return result.reasoning, result.content, [(c.name, c.arguments) for c in result.tool_calls], result.error


def _entries(cache: ResultCache) -> list[tuple[Path, int, bytes]]:
    """Every entry the cache's packs hold: (its pack, its offset there, its bytes), in the order written."""
    return [(pack, offset, line) for folder in sorted(cache.folder.glob("*/*")) if folder.is_dir()
            for _, pack, offset, line in pack_entries(folder)]


def _rewrite(pack: Path, offset: int, old: bytes, new: bytes) -> None:
    """The pack with one entry's bytes replaced by `new` (whatever follows it, its newline included, kept)."""
    data = pack.read_bytes()
    pack.write_bytes(data[:offset] + new + data[offset + len(old):])


def _current(spec: str) -> FingerprintFolder:
    """Where this code keeps the release's answers (its wheel, dependencies and the glue's fingerprint)."""
    engine, _, version = spec.partition("@")
    fingerprint = release_fingerprint(spec, backend.release_dependencies(engine, version, offline=True))
    assert fingerprint is not None
    return fingerprint.folder


def test_a_second_ask_reads_the_answer_and_starts_no_worker(cache: ResultCache) -> None:
    need("sglang@0.5.23")
    engine = backend.RealEngine("sglang", "0.5.23")
    first = _parse(engine)
    assert (first.reasoning, first.content) == ("\nhmm\n", "\n\nSure.\n")  # 0.5.23 keeps them verbatim
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("get_weather", '{"city": "Paris", "days": 3}')]
    [(pack, _, _)] = _entries(cache)
    current = _current("sglang@0.5.23")
    assert pack.parent == cache.folder / "sglang@0.5.23" / current.fingerprint
    backend.stop_workers()
    cache.clear_memory()
    again = _parse(engine)
    assert again == first
    assert "sglang@0.5.23" not in backend._WORKERS  # answered from the file
    assert (cache.hits, cache.misses, cache.rejected) == (1, 1, 0)


def test_the_key_names_the_job_in_order_and_the_release() -> None:
    need("sglang@0.5.23", "sglang@0.5.12")
    deps = backend.release_dependencies("sglang", "0.5.23")
    new = release_fingerprint("sglang@0.5.23", deps)
    old = release_fingerprint("sglang@0.5.12", backend.release_dependencies("sglang", "0.5.12"))
    assert new is not None and old is not None and new.wheel_sha256 != old.wheel_sha256
    job = {"op": "parse", "text": "a", "tools": [{"a": 1, "b": 2}]}
    reordered = {"op": "parse", "text": "a", "tools": [{"b": 2, "a": 1}]}
    assert new.key(job) == new.key(dict(job))
    assert len({new.key(job), new.key(reordered), old.key(job)}) == 3


@pytest.mark.parametrize("tamper", ["reply edited", "hash edited", "torn write", "not json"])
def test_a_corrupt_or_tampered_entry_is_detected_and_asked_again(cache: ResultCache, tamper: str) -> None:
    need("sglang@0.5.23")
    engine = backend.RealEngine("sglang", "0.5.23")
    first = _parse(engine)
    [(pack, offset, line)] = _entries(cache)
    stored = json.loads(line)
    if tamper == "reply edited":
        stored["reply"]["result"]["content"] = "Sure, forged."
        _rewrite(pack, offset, line, json.dumps(stored).encode())
    elif tamper == "hash edited":
        stored["sha256"] = "0" * 64
        _rewrite(pack, offset, line, json.dumps(stored).encode())
    elif tamper == "torn write":
        pack.write_bytes(pack.read_bytes()[:offset + 100])  # its end and newline lost
    else:
        _rewrite(pack, offset, line, b"\x00\xff")
    cache.clear_memory()
    again = _parse(engine)
    assert _answer(again) == _answer(first)
    assert again.content == "\n\nSure.\n"
    assert cache.rejected == 1
    # asked again and stored whole after what is left of the tampered entry: a line rewritten by json.dumps (a space
    # after each colon) or garbage is no entry at all; the torn one keeps its head, ended by the new entry's newline
    entries = _entries(cache)
    assert len(entries) == (2 if tamper == "torn write" else 1)
    assert json.loads(entries[-1][2])["reply"]["result"]["content"] == "\n\nSure.\n"
    # and that is what another process reads
    other = ResultCache(cache.folder)
    key = json.loads(entries[-1][2])["key"]
    assert other.get(_current("sglang@0.5.23"), key) == json.loads(entries[-1][2])["reply"]
    assert other.rejected == 0


def test_a_worker_that_cannot_answer_leaves_nothing(cache: ResultCache, monkeypatch: pytest.MonkeyPatch) -> None:
    need("sglang@0.5.23")
    backend.stop_workers()
    # a worker limited to 1 s of start-up time under a 1 MB address space cannot start: one sentence, nothing kept
    monkeypatch.setenv("DRIFT_ENGINE_MEMORY_MB", "1")
    result = _parse(backend.RealEngine("sglang", "0.5.23"))
    assert result.error is not None and result.error.startswith("the sglang@0.5.23 worker ")
    assert _entries(cache) == []
    monkeypatch.delenv("DRIFT_ENGINE_MEMORY_MB")
    backend.stop_workers()
    assert _parse(backend.RealEngine("sglang", "0.5.23")).content == "\n\nSure.\n"
    assert len(_entries(cache)) == 1


def test_only_answers_of_the_current_fingerprint_make_a_release_warm(cache: ResultCache,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    need("sglang@0.5.23")
    backend.stop_workers()
    spec, current = "sglang@0.5.23", _current("sglang@0.5.23")
    # What an older glue answered, in its own folder, and an answer of the flat layout before fingerprint folders
    flat = cache.folder / spec / "22" / f"{'2' * 64}.json"
    flat.parent.mkdir(parents=True)
    flat.write_bytes(b'{"key":"' + b"2" * 64 + b'","sha256":"","reply":{}}')
    older = FingerprintFolder.of(spec, {"glue": "an older glue"})
    cache.put(older, "1" * 64, {"ok": True, "result": {"content": "an older glue's answer"}})
    cache.pruning[spec].join()  # the first use of the spec's folders pruned the flat layout away
    assert not flat.parent.exists()
    assert not cache.holds_answers_of(current)
    monkeypatch.setenv("DRIFT_ENGINE_MAX_WORKERS", "0")  # the cold list alone, no worker started
    assert backend.spawn_workers([("sglang", "0.5.23")]) == [spec]
    monkeypatch.delenv("DRIFT_ENGINE_MAX_WORKERS")
    assert _parse(backend.RealEngine("sglang", "0.5.23")).content == "\n\nSure.\n"  # asked, kept under current
    assert cache.holds_answers_of(current)
    assert backend.spawn_workers([("sglang", "0.5.23")]) == []  # warm: no worker started ahead
    assert sorted(p.name for p in (cache.folder / spec).iterdir()) == sorted([older.fingerprint, current.fingerprint])
    backend.stop_workers()
