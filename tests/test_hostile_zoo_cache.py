"""A corrupt or tampered zoo cache entry (engine/zoo.py ZooCache, one file per template sha256) is detected by its
content sha256 and scanned again, never trusted and never a crash; the rescan overwrites it with a sound entry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.zoo import ZooCache, ZooScan, run_scan, zoo_template

GOOD = "Qwen-Qwen3.5-0.8B"
OTHER = "zai-org-GLM-5.1"
SCENARIOS = ["tool-call", "args-serialization"]


def _timeless(result: dict) -> dict:
    """A result's JSON without its scan time (which differs between scans)."""
    return {k: v for k, v in result.items() if k != "seconds"}


def _scan(cache: ZooCache, name: str = GOOD) -> ZooScan:
    return run_scan([zoo_template(name)], scenarios=SCENARIOS, cache=cache)


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A cache holding GOOD's and OTHER's results: (its root, GOOD's entry, OTHER's entry) as written."""
    root = tmp_path_factory.mktemp("zoo-cache")
    cache = ZooCache(root)
    for name in (GOOD, OTHER):
        assert _scan(cache, name).cached == 0
    entries = []
    for name in (GOOD, OTHER):
        (path,) = root.rglob(f"{zoo_template(name).sha256}.json")
        entries.append(json.loads(path.read_text(encoding="utf-8")))
    return root, entries[0], entries[1]


def _entry_path(root: Path, name: str = GOOD) -> Path:
    (path,) = root.rglob(f"{zoo_template(name).sha256}.json")
    return path


def test_an_entry_holds_the_sha256_of_its_result(filled):
    root, entry, _ = filled
    assert set(entry) == {"sha256", "result"}
    assert entry["sha256"] == ZooCache.content_sha256(entry["result"]) and len(entry["sha256"]) == 64
    assert entry["result"]["sha256"] == zoo_template(GOOD).sha256
    again = _scan(ZooCache(root))
    assert again.cached == 1 and again.results[0].to_json() == entry["result"]


def _edit_result(change: Callable[[dict], None]) -> Callable[[dict, dict], bytes]:
    def tamper(entry: dict, _other: dict) -> bytes:
        edited = json.loads(json.dumps(entry))
        change(edited["result"])
        return json.dumps(edited).encode()
    return tamper


TAMPERED = [
    ("a-cell-flipped", _edit_result(lambda r: r["cells"][0].update(status="holds" if r["cells"][0]["status"] !=
                                                                    "holds" else "breaks"))),
    ("a-count-changed", _edit_result(lambda r: r.update(format="harmony"))),
    ("hash-removed", lambda entry, _: json.dumps(entry["result"]).encode()),  # the format before entries were hashed
    ("hash-of-nothing", lambda entry, _: json.dumps({**entry, "sha256": "0" * 64}).encode()),
    ("another-templates-entry", lambda _, other: json.dumps(other).encode()),  # its own hash is right
    ("cut-short", lambda entry, _: json.dumps(entry).encode()[:100]),
    ("empty", lambda entry, _: b""),
    ("binary", lambda entry, _: b"\x89PNG\r\n\x1a\n\x00\xff"),
    ("latin-1", lambda entry, _: json.dumps(entry).replace("Qwen", "Qw\u00e9n").encode("latin-1")),
    ("a-list", lambda entry, _: b"[1, 2, 3]"),
    ("result-a-list", lambda entry, _: json.dumps({"sha256": ZooCache.content_sha256([1]), "result": [1]}).encode()),
    ("cells-not-objects", lambda entry, _: json.dumps({"sha256": ZooCache.content_sha256(r := {**entry["result"],
                                                                                              "cells": [1]}),
                                                       "result": r}).encode()),
    ("nested-100k-deep", lambda entry, _: b"[" * 100_000 + b"]" * 100_000),
]


@pytest.mark.parametrize("tamper", [c[1] for c in TAMPERED], ids=[c[0] for c in TAMPERED])
def test_a_corrupt_or_tampered_entry_is_scanned_again(filled, tamper):
    root, entry, other = filled
    path = _entry_path(root)
    path.write_bytes(tamper(entry, other))
    scan = _scan(ZooCache(root))
    assert scan.cached == 0  # not trusted: scanned again
    assert _timeless(scan.results[0].to_json()) == _timeless(entry["result"])  # the true result, not the edited one
    rewritten = json.loads(path.read_text(encoding="utf-8"))  # and the entry is sound again
    assert rewritten["sha256"] == ZooCache.content_sha256(rewritten["result"])
    assert _timeless(rewritten["result"]) == _timeless(entry["result"])
    assert _scan(ZooCache(root)).cached == 1


def test_a_folder_in_place_of_an_entry_is_scanned_and_left(filled):
    """An entry that cannot be read or replaced (a folder in its place) costs a scan each run, never a crash."""
    root, entry, _ = filled
    path = _entry_path(root)
    path.unlink()
    path.mkdir()
    try:
        for _ in range(2):
            scan = _scan(ZooCache(root))
            assert scan.cached == 0 and _timeless(scan.results[0].to_json()) == _timeless(entry["result"])
    finally:
        path.rmdir()
        path.write_text(json.dumps(entry), encoding="utf-8")
