"""Engine release names that are not releases: refused in one sentence before any fetch or network call, with nothing
written anywhere (the engine cache included), through the library entry points the app uses and every CLI command
that takes an engine.

The engine cache (DRIFT_ENGINE_CACHE) is a fresh folder holding only PyPI's release index as fetch.py keeps it (written
now, so it is fresh); every way out to the network (fetch's index request, pip's HTTP session, range reads, the full
download, sockets) and a worker start fail the test if touched.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

from engine.cli import main
from engine.errors import ExplorerError
from engine.serving.real import backend, fetch
from engine.serving.registry import get_engine, known_engine
from engine.timeline import releases, timeline

ROOT = Path(__file__).resolve().parent.parent
LONG = "vllm@" + "1" * 10_000
NOT_A_VERSION = "is not a version as PyPI lists it (digits and dots, e.g. {first})"

# (the engine argument, the sentence known_engine and get_engine give: the CLI prints it after "error: ")
HOSTILE_SPECS = [
    # the release part is read up to the first "/" (a parser pair follows it), so "vllm@../x" names release "vllm@.."
    ("vllm@../x", "'vllm@..' is not a release: '..' " + NOT_A_VERSION.format(first="0.10.0")),
    ("vllm@0.33.0/../../etc", "engine 'vllm@0.33.0/../../etc': name the parser pair as RELEASE/REASONING+TOOL (- for "
     "none)"),
    ("vllm@99.0", "unknown engine 'vllm@99.0': vllm@99.0 is not a release on PyPI from 0.10.0 on"),
    ("sglang@0.5.0", "unknown engine 'sglang@0.5.0': sglang@0.5.0 is not a release on PyPI from 0.5.1 on"),
    ("sglang@", "'sglang@' names no version: give one as PyPI lists it, e.g. sglang@0.5.1"),
    ("vllm@%2e%2e%2fx", "'vllm@%2e%2e%2fx' is not a release: '%2e%2e%2fx' " + NOT_A_VERSION.format(first="0.10.0")),
    ("vllm@..", "'vllm@..' is not a release: '..' " + NOT_A_VERSION.format(first="0.10.0")),
    ("real:vllm@../../x/-+-", "'vllm@..' is not a release: '..' " + NOT_A_VERSION.format(first="0.10.0")),
    # `+` after a release names a layer (issue 27): a local version is an unknown one
    ("vllm@1.0+local", "unknown layer 'local' in engine 'vllm@1.0+local'; known: a template runtime (minijinja, hfjs) "
                       "or a proxy (litellm, langchain-openai, reasoning-field; litellm@VERSION: another LiteLLM "
                       "release); a release is named without a local version (+...)"),
    ("vllm@v0.33.0", "'vllm@v0.33.0' is not a release: 'v0.33.0' " + NOT_A_VERSION.format(first="0.10.0")),
    ("sglang@0.5.23\n", "'sglang@0.5.23\\n' is not a release: '0.5.23\\n' " + NOT_A_VERSION.format(first="0.5.1")),
]
# no name over 200 characters is read further (engine/serving/spec.py)
LONG_SENTENCE = ("unknown engine 'vllm@" + "1" * 55 + "'…: an engine name is at most 200 characters, this one has "
                 "10005")


def _index(versions: list[str]) -> dict:
    return {"fetched_at": time.time(), "releases": [
        {"version": v, "url": f"https://files.example/x-{v}.whl", "filename": f"x-{v}-py3-none-any.whl", "size": 1,
         "sha256": "0" * 64} for v in versions]}


def _files(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its content (None for a folder)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


@pytest.fixture
def no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh engine cache holding a fresh release index; HOME and the working folder inside tmp_path; every network
    path and worker start recorded and failed. Yields the list of what was touched; afterwards nothing in tmp_path
    may have changed."""
    cache = tmp_path / "engines"
    (cache / "index").mkdir(parents=True)
    (cache / "index" / "vllm.json").write_text(json.dumps(_index(["0.10.0", "0.31.0", "0.33.0"])))
    (cache / "index" / "sglang.json").write_text(json.dumps(_index(["0.5.1", "0.5.12", "0.5.23"])))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("DRIFT_ENGINE_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "work")
    touched: list[str] = []

    def guard(what: str):
        def refuse(*args, **kwargs):
            touched.append(what)
            raise AssertionError(f"{what} was called for a name that is not a release")
        return refuse

    for name in ("_index_from_pypi", "_session", "_read_by_ranges", "_read_by_download", "network_available"):
        monkeypatch.setattr(fetch, name, guard(f"fetch.{name}"))
    monkeypatch.setattr(backend.Worker, "start", guard("backend.Worker.start"))
    monkeypatch.setattr(socket.socket, "connect", guard("socket.connect"))
    monkeypatch.setattr(socket, "create_connection", guard("socket.create_connection"))
    fetch_cache_before = _files(tmp_path)
    yield touched
    assert touched == []
    assert _files(tmp_path) == fetch_cache_before, "something was written"


@pytest.mark.parametrize("spec,expected", HOSTILE_SPECS, ids=[s[0] for s in HOSTILE_SPECS])
def test_known_engine_and_get_engine_refuse_without_the_network(no_network, spec, expected):
    with pytest.raises(ExplorerError) as known:
        known_engine(spec)
    with pytest.raises(ValueError) as got:
        get_engine(spec)
    assert (str(known.value), str(got.value)) == (expected, expected)


def test_a_ten_thousand_character_name_is_refused_in_a_short_sentence(no_network):
    with pytest.raises(ExplorerError) as known:
        known_engine(LONG)
    with pytest.raises(ValueError) as got:
        get_engine(LONG)
    assert (str(known.value), str(got.value)) == (LONG_SENTENCE, LONG_SENTENCE)


# (engine, version) as the fetch layer and the backend take them: FetchError / the sentence why not
RAW_RELEASES = [
    ("vllm", "../x", "'vllm@../x' is not a release: '../x' " + NOT_A_VERSION.format(first="0.10.0")),
    ("sglang", "0.5.23/../../x", "'sglang@0.5.23/../../x' is not a release: '0.5.23/../../x' "
     + NOT_A_VERSION.format(first="0.5.1")),
    ("vllm", "%2e%2e%2fx", "'vllm@%2e%2e%2fx' is not a release: '%2e%2e%2fx' " + NOT_A_VERSION.format(first="0.10.0")),
    ("vllm", "", "'vllm@' names no version: give one as PyPI lists it, e.g. vllm@0.10.0"),
    ("vllm", "9" * 10_000, "'vllm@" + "9" * 54 + "…' is not a release: a version of 10,000 characters (at most 32)"),
    ("../vllm", "0.33.0", "'../vllm@0.33.0' is not a release: unknown engine '../vllm'; known: vllm, sglang"),
]


@pytest.mark.parametrize("engine,version,expected", RAW_RELEASES, ids=[f"{e}@{v[:20]}" for e, v, _ in RAW_RELEASES])
def test_the_fetch_layer_refuses_before_the_cache_or_the_network(no_network, engine, version, expected):
    for fetches in (lambda: fetch.fetch_sources(engine, version), lambda: fetch.release(engine, version),
                    lambda: fetch.requirements(engine, version), lambda: fetch.cached_sources(f"{engine}@{version}"),
                    lambda: backend.worker_for(engine, version)):
        with pytest.raises(fetch.FetchError) as caught:
            fetches()
        assert str(caught.value) == expected
    assert backend.release_problem(engine, version) == expected


def test_an_unlisted_version_asks_pypi_again_only_when_the_index_is_an_hour_old(no_network, monkeypatch):
    with pytest.raises(fetch.FetchError, match=r"^vllm@0\.34\.0 is not a release on PyPI from 0\.10\.0 on$"):
        fetch.release("vllm", "0.34.0")
    assert no_network == []
    index = Path(os.environ["DRIFT_ENGINE_CACHE"]) / "index" / "vllm.json"
    as_found = index.read_bytes()
    data = json.loads(as_found)
    data["fetched_at"] -= fetch.INDEX_RECHECK_S + 60
    index.write_text(json.dumps(data))
    asked: list[str] = []
    monkeypatch.setattr(fetch, "_index_from_pypi", lambda engine, timeout_s: asked.append(engine) or data["releases"])
    with pytest.raises(fetch.FetchError):
        fetch.release("vllm", "0.34.0")
    assert asked == ["vllm"]
    index.write_bytes(as_found)  # as the fixture made it


@pytest.mark.parametrize("first,last,expected", [
    ("../x", None, "'vllm@../x' is not a release: '../x' " + NOT_A_VERSION.format(first="0.10.0")),
    (None, "%2e%2e", "'vllm@%2e%2e' is not a release: '%2e%2e' " + NOT_A_VERSION.format(first="0.10.0")),
    ("99.0", None, "no vllm release between 99.0 and the last"),
])
def test_timeline_ends_are_refused_before_the_index_is_read(no_network, first, last, expected):
    with pytest.raises(ValueError) as caught:
        timeline("qwen3.5", "tool-call", "vllm", first=first, last=last)
    assert str(caught.value) == expected
    if first == "99.0":
        assert releases("vllm", first, last) == []  # well-formed: the cached index answers, no release that late
    else:
        with pytest.raises(ValueError, match=re.escape(expected)):
            releases("vllm", first, last)


# ---- through the CLI: exit 2, one sentence -----------------------------------------------------------------------

def _cli_cases(tmp_text: str) -> list[tuple[str, list[str]]]:
    trace = str(ROOT / "samples" / "traces" / "openai.jsonl")
    return [
        ("matrix", ["matrix", "--models", "qwen3.5", "--scenarios", "tool-call", "--engines"]),
        ("parse", ["parse", "--model", "qwen3.5", "--text", tmp_text, "--engine"]),
        ("trace", ["trace", trace, "--model", "qwen3.5", "--engine"]),
        ("session", ["session", "--model", "qwen3.5", "--script", "handbook", "--engine"]),
        ("export", ["export", "--model", "qwen3.5", "--scenario", "tool-call", "--json", "-", "--engine"]),
        ("check", ["check", "--model", "qwen3.5", "--template", tmp_text, "--engine"]),
        ("fuzz", ["fuzz", "--model", "qwen3.5", "--n", "2", "--workers", "1", "--quiet", "--engine"]),
    ]


@pytest.mark.parametrize("spec,expected", HOSTILE_SPECS + [(LONG, "unknown engine 'vllm@11111111111111111111")],
                         ids=[s[0] for s in HOSTILE_SPECS] + ["10000-characters"])
def test_every_command_taking_an_engine_refuses_it_in_one_sentence(no_network, tmp_path, capsys, spec, expected):
    text = tmp_path / "work" / "output.txt"
    text.write_text("{{ 'hello' }}", encoding="utf-8")
    try:
        for command, argv in _cli_cases(str(text)):
            code = main([*argv, spec])
            out, err = capsys.readouterr()
            assert (command, code) == (command, 2), err
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (command, err)
            assert expected in lines[0] and len(lines[0]) < 400, (command, lines[0])
    finally:
        text.unlink()


@pytest.mark.parametrize("bound", ["--from", "--to"])
def test_timeline_refuses_a_version_that_is_not_one(no_network, capsys, bound):
    code = main(["timeline", "--model", "qwen3.5", "--scenario", "tool-call", "--engine", "vllm", bound,
                 "0.33.0/../../etc"])
    assert code == 2
    assert capsys.readouterr().err == ("error: 'vllm@0.33.0/../../etc' is not a release: '0.33.0/../../etc' "
                                       + NOT_A_VERSION.format(first="0.10.0") + "\n")
