"""The result cache's folders per code fingerprint (engine/serving/real/results.py): answers no current code can read
(another fingerprint's, the flat layout's) are pruned, the current fingerprint's and the most recently used others'
kept, also while other threads write and prune; a torn entry is still rejected; `python -m engine cache` reports and
prunes. Every cache here is a folder of tmp_path, never the engine cache's."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from engine.cause_store import STORE, cause_folder
from engine.cli import main
from engine.serving.real.results import FLAT, TRASH, FingerprintFolder, ResultCache, pack_entries

DAY = 86_400


def _older(name: str) -> FingerprintFolder:
    """The causes folder of a code that is not this one (another branch, an earlier edit)."""
    return FingerprintFolder.of(STORE, {"code": name})


def _reply(n: int) -> dict:
    return {"cause": {"stage": "template", "n": n}}


def _key(n: int, folder: FingerprintFolder) -> str:
    return f"{folder.fingerprint}{n:048x}"


def _store(root: Path, folder: FingerprintFolder, answers: int, age_days: int = 0) -> None:
    """`answers` entries of `folder`, written by a cache of their own (another process), the folder last used
    `age_days` ago. Made beside the spec's folder and renamed into it, as whole, with its age: a prune running
    meanwhile never sees it younger than it is."""
    staging = ResultCache(root / "staging")
    for n in range(answers):
        staging.put(folder, _key(n, folder), _reply(n))
    staging.pruning[folder.spec].join()
    made = staging.folder / folder.spec / folder.fingerprint
    if age_days:
        when = made.stat().st_mtime - age_days * DAY
        os.utime(made, (when, when))
    (root / "results" / folder.spec).mkdir(parents=True, exist_ok=True)
    made.rename(root / "results" / folder.spec / folder.fingerprint)


def _flat_entry(root: Path, spec: str, key: str) -> Path:
    """An entry where the code before fingerprint folders kept it: results/<spec>/<key[:2]>/<key>.json."""
    path = root / "results" / spec / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"key":"' + key.encode() + b'","sha256":"","reply":{}}')
    return path


def _folders(root: Path, spec: str) -> list[str]:
    return sorted(p.name for p in (root / "results" / spec).iterdir())


def _answers(root: Path, folder: FingerprintFolder, count: int) -> list[dict | None]:
    fresh = ResultCache(root / "results")  # another process: nothing in memory
    replies = [fresh.get(folder, _key(n, folder)) for n in range(count)]
    fresh.pruning[folder.spec].join()
    return replies


@pytest.mark.parametrize(("keep", "kept"), [(1, ["current"]), (2, ["current", "a day old"]),
                                            (3, ["current", "a day old", "two days old"])])
def test_a_prune_keeps_the_current_and_the_most_recently_used_and_removes_the_rest(tmp_path: Path, keep: int,
                                                                                   kept: list[str]) -> None:
    current = cause_folder()
    ages = {"a day old": 1, "two days old": 2, "three days old": 3}
    for name, age in ages.items():
        _store(tmp_path, _older(name), 2, age)
    _store(tmp_path, current, 3, age_days=30)  # the current one is kept however long ago it was used
    flat = _flat_entry(tmp_path, STORE, "ab" + "0" * 62)
    cache = ResultCache(tmp_path / "results")
    removed = cache.prune(STORE, current.fingerprint, keep)
    gone = [name for name in ages if name not in kept]
    assert removed == [_older(name).fingerprint for name in gone] + [FLAT]
    fingerprints = {"current": current.fingerprint} | {name: _older(name).fingerprint for name in ages}
    assert _folders(tmp_path, STORE) == sorted(fingerprints[name] for name in kept)
    assert not flat.exists() and list((tmp_path / "results" / TRASH).iterdir()) == []
    assert _answers(tmp_path, current, 3) == [_reply(n) for n in range(3)]
    if "a day old" in kept:
        assert _answers(tmp_path, _older("a day old"), 2) == [_reply(0), _reply(1)]


def test_the_first_use_of_a_spec_in_a_process_prunes_it_beside_the_asks(tmp_path: Path) -> None:
    for name, age in (("a day old", 1), ("two days old", 2)):
        _store(tmp_path, _older(name), 1, age)
    flat = _flat_entry(tmp_path, STORE, "cd" + "0" * 62)
    cache = ResultCache(tmp_path / "results")
    current = cause_folder()
    assert cache.get(current, _key(0, current)) is None  # a read is a use too: the prune starts
    cache.pruning[STORE].join()
    assert _folders(tmp_path, STORE) == [_older("a day old").fingerprint]
    assert not flat.parent.exists()
    cache.put(current, _key(0, current), _reply(0))
    assert cache.holds_answers_of(current) and not cache.holds_answers_of(_older("two days old"))
    assert _folders(tmp_path, STORE) == sorted([_older("a day old").fingerprint, current.fingerprint])


def test_a_torn_entry_of_the_current_fingerprint_is_rejected_and_not_read_again(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "results")
    current = cause_folder()
    cache.put(current, _key(0, current), _reply(0))
    [(_, pack, offset, _)] = pack_entries(tmp_path / "results" / STORE / current.fingerprint)
    pack.write_bytes(pack.read_bytes()[:offset + 40])
    cache.clear_memory()
    assert cache.get(current, _key(0, current)) is None
    assert cache.get(current, _key(0, current)) is None  # rejected once, then not read again
    assert (cache.hits, cache.misses, cache.rejected) == (0, 2, 1)
    other = ResultCache(tmp_path / "results")  # another process: a torn line is no entry
    assert other.get(current, _key(0, current)) is None and other.rejected == 0
    cache.put(current, _key(0, current), _reply(0))  # asked again
    assert ResultCache(tmp_path / "results").get(current, _key(0, current)) == _reply(0)


def _at_once(*work: tuple) -> None:
    """Run each (function, args...) in a thread of its own, started together; wait for all of them."""
    start = threading.Barrier(len(work))

    def run(function, *args) -> None:
        start.wait()
        function(*args)

    threads = [threading.Thread(target=run, args=w) for w in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _write(cache: ResultCache, folder: FingerprintFolder, answers: int) -> None:
    for n in range(1, answers):
        cache.put(folder, _key(n, folder), _reply(n))


def _prune_again_and_again(cache: ResultCache, keep: int) -> None:
    for _ in range(20):
        cache.prune(STORE, keep=keep)


def _leave_stale_folders(root: Path, count: int) -> None:
    for n in range(count):
        _store(root, _older(f"an old edit {n}"), 3, age_days=n + 1)


def test_a_process_writing_while_its_threads_prune_keeps_every_answer_of_its_code(tmp_path: Path) -> None:
    # Its folder last touched a month ago, older codes' folders appearing meanwhile, each used more recently, and
    # every prune keeping one fingerprint: what this process uses is the one kept
    cache, current, answers = ResultCache(tmp_path / "results"), cause_folder(), 200
    cache.put(current, _key(0, current), _reply(0))
    cache.pruning[STORE].join()
    mine = tmp_path / "results" / STORE / current.fingerprint
    month_ago = mine.stat().st_mtime - 30 * DAY
    os.utime(mine, (month_ago, month_ago))
    _at_once((_write, cache, current, answers), (_write, cache, current, answers),
             (_prune_again_and_again, cache, 1), (_prune_again_and_again, cache, 1),
             (_leave_stale_folders, tmp_path, 6))
    cache.prune(STORE, keep=1)
    assert _folders(tmp_path, STORE) == [current.fingerprint]
    assert _answers(tmp_path, current, answers) == [_reply(n) for n in range(answers)]
    assert list((tmp_path / "results" / TRASH).iterdir()) == []


def test_two_processes_of_two_codes_writing_and_pruning_at_once_lose_none_of_their_answers(tmp_path: Path) -> None:
    # Two branches' processes share the cache: each keeps its own fingerprint and the other's (the two most recently
    # used), while older codes' folders keep appearing and every thread prunes again and again
    branches = [FingerprintFolder.of(STORE, {"code": "branch a"}), FingerprintFolder.of(STORE, {"code": "branch b"})]
    caches = [ResultCache(tmp_path / "results") for _ in branches]
    for cache, folder in zip(caches, branches):
        cache.put(folder, _key(0, folder), _reply(0))  # each process's first write
        cache.pruning[STORE].join()
    answers = 150
    _at_once(*[(_write, cache, folder, answers) for cache, folder in zip(caches, branches)],
             *[(_prune_again_and_again, cache, 2) for cache in caches], (_leave_stale_folders, tmp_path, 6))
    caches[0].prune(STORE)
    assert _folders(tmp_path, STORE) == sorted(f.fingerprint for f in branches)
    for folder in branches:
        assert _answers(tmp_path, folder, answers) == [_reply(n) for n in range(answers)]
    assert list((tmp_path / "results" / TRASH).iterdir()) == []


def test_the_cache_command_reports_each_spec_and_prunes_what_no_current_code_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DRIFT_RESULT_CACHE_DIR", str(tmp_path / "results"))
    current = cause_folder()
    _store(tmp_path, current, 2)
    _store(tmp_path, _older("a day old"), 1, age_days=1)
    _store(tmp_path, _older("two days old"), 1, age_days=2)
    _flat_entry(tmp_path, STORE, "ef" + "0" * 62)
    _flat_entry(tmp_path, "vllm@0.0.1", "12" + "0" * 62)  # a release not in the engine cache: no fingerprint here

    def size(*parts: str) -> int:
        return sum(p.stat().st_size for p in (tmp_path / "results").joinpath(*parts).rglob("*") if p.is_file())

    order = [current.fingerprint, _older("a day old").fingerprint, _older("two days old").fingerprint]
    sizes = {name: size(STORE, name) for name in order} | {FLAT: size(STORE, "ef")}
    release_flat = size("vllm@0.0.1")

    def folder(name: str) -> dict:
        return {"fingerprint": name, "answers": 2 if name == current.fingerprint else 1, "bytes": sizes[name]}

    assert main(["cache", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"folder": str(tmp_path / "results"), "pruned": False, "specs": [
        {"spec": STORE, "current": current.fingerprint, "kept": [folder(n) for n in [*order, FLAT]], "removed": [],
         "answers": 5, "bytes": sum(sizes.values())},
        {"spec": "vllm@0.0.1", "current": None, "kept": [{"fingerprint": FLAT, "answers": 1, "bytes": release_flat}],
         "removed": [], "answers": 1, "bytes": release_flat}]}

    assert main(["cache", "--prune"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kept = sizes[current.fingerprint] + sizes[order[1]]
    assert lines[1:] == [
        f"{STORE}: 3 answers, {kept:,} B; kept: {current.fingerprint} (current) 2 answers "
        f"{sizes[current.fingerprint]:,} B, {order[1]} 1 answers {sizes[order[1]]:,} B; removed: {order[2]} 1 answers "
        f"{sizes[order[2]]:,} B, the flat layout 1 answers {sizes[FLAT]:,} B",
        f"vllm@0.0.1: 0 answers, 0 B; current: not known here; removed: the flat layout 1 answers {release_flat:,} B",
        f"in all: {kept:,} B kept, {sizes[order[2]] + sizes[FLAT] + release_flat:,} B removed"]
    assert _folders(tmp_path, STORE) == sorted(order[:2])


def test_an_answer_another_process_appends_is_read_on_a_later_miss(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A reads the folder (finds nothing), B answers meanwhile: A's next miss reads B's pack anew (at most once a
    # second: RESCAN_S, 0 here so that the test waits on nothing)
    import engine.serving.real.results as results

    monkeypatch.setattr(results, "RESCAN_S", 0.0)
    reader, writer, current = ResultCache(tmp_path / "results"), ResultCache(tmp_path / "results"), cause_folder()
    assert reader.get(current, _key(0, current)) is None
    writer.put(current, _key(0, current), _reply(0))
    writer.put(current, _key(1, current), _reply(1))
    assert [reader.get(current, _key(n, current)) for n in (0, 1)] == [_reply(0), _reply(1)]
    assert (reader.hits, reader.misses, reader.rejected) == (2, 1, 0)
    monkeypatch.setattr(results, "RESCAN_S", 3600.0)  # and not before RESCAN_S has passed
    writer.put(current, _key(2, current), _reply(2))
    assert reader.get(current, _key(2, current)) is None
