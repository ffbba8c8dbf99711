"""The real-engine backend: releases' own sources fetched, run sandboxed, checked against the golden corpus and the
timeline's two known changes. Needs the engine cache or PyPI; in CI (CI=true) these tests always run."""

from __future__ import annotations

import hashlib
import json
import stat
import sys
from pathlib import Path

import pytest
from conftest import require_release as need

from engine.serving.real import fetch

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "benchmarks"))

QWEN_VOCAB = {"<think>": 151667, "</think>": 151668, "<tool_call>": 151657, "</tool_call>": 151658}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
ANSWER_AROUND_CALL = ("<think>\nhmm\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                      "</parameter>\n</function>\n</tool_call>")


def test_sources_are_content_addressed_read_only_and_licensed():
    need("sglang@0.5.13")
    sources = fetch.fetch_sources("sglang", "0.5.13")
    manifest = json.loads((sources.root.parent / "manifest.json").read_text())
    assert sources.license is not None and "Apache License" in sources.license.read_text()
    path, digest = "sglang/srt/entrypoints/openai/serving_chat.py", manifest["files"][
        "sglang/srt/entrypoints/openai/serving_chat.py"]
    data = (sources.root / path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest
    assert (fetch.cache_dir() / "objects" / digest).read_bytes() == data
    assert not (sources.root / path).stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert all(name.endswith(".py") or "dist-info" in name for name in manifest["files"])


def test_registry_resolves_any_release_and_keeps_the_emulations():
    need("vllm@0.31.0")
    from engine.serving.real.backend import RealEngine
    from engine.serving.registry import get_engine

    assert type(get_engine("vllm@0.33.0")).__name__ == "VllmEmulation"
    real = get_engine("vllm@0.31.0")
    assert isinstance(real, RealEngine) and real.spec == "vllm@0.31.0"
    assert {"hermes", "qwen3_coder", "glm47", "minimax_m2", "llama3_json"} <= set(real.tool_parsers)
    with pytest.raises(ValueError, match="unknown engine 'vllm@0.9.99'"):
        get_engine("vllm@0.9.99")


# (passes, differing fields) of the pinned releases' 259 golden cases per mode, through their own serving code. The
# golden files are written from that same code (tests/conformance/generate.py), so this checks that a regenerated
# golden file and the backend agree and that nothing in a release's run drifts (stubs, vocabularies, chunking).
PINNED_OUTCOMES = {(spec, mode): (259, {}) for spec in ("vllm@0.33.0", "sglang@0.5.12", "sglang@0.5.23")
                   for mode in ("ns", "st")}


@pytest.mark.parametrize(("spec", "mode"), sorted(PINNED_OUTCOMES))
def test_pinned_golden_cases_through_the_real_serving_code(spec, mode):
    need(spec)
    import real_engines

    row = real_engines.check_release(*spec.split("@"), mode)
    assert row.loads and row.cases == 259 and not row.missing
    assert (row.passes, dict(row.differs)) == PINNED_OUTCOMES[(spec, mode)], row.examples


def test_sglang_stops_stripping_the_answer_at_0_5_13():
    need("sglang@0.5.12", "sglang@0.5.12.post1", "sglang@0.5.13")
    from engine.timeline import timeline

    rows = timeline("qwen3.6", "tool-call", "sglang", first="0.5.12", last="0.5.13")
    assert [(r.release, r.changed) for r in rows] == [
        ("sglang@0.5.12", False), ("sglang@0.5.12.post1", False), ("sglang@0.5.13", True)]
    # reasoning_parser.py strips the answer up to 0.5.12, so the "\n\n" before the call is an empty answer: null
    assert [r.parses[0]["content"] for r in rows] == [None, None, "\n\n"]


def test_vllm_starts_stripping_answers_around_tool_calls_at_0_24_0():
    need("vllm@0.23.0", "vllm@0.24.0")
    from engine.serving.real.backend import AddedVocab, RealEngine

    vocab = AddedVocab(QWEN_VOCAB, frozenset())
    contents = {v: RealEngine("vllm", v).parse(ANSWER_AROUND_CALL, reasoning_parser="qwen3",
                                               tool_parser="qwen3_coder", tools=TOOLS, vocab=vocab).content
                for v in ("0.23.0", "0.24.0")}
    assert contents == {"0.23.0": "\n\nSure.\n", "0.24.0": "Sure."}


def test_vllm_timeline_bisects_the_glm_reasoning_change():
    # From 0.22.0: before it, the releases' request side drops the client's reasoning_content altogether
    # (tests/test_engine_request_side.py), a change of its own.
    need("vllm@0.22.0", "vllm@0.23.0", "vllm@0.24.0", "vllm@0.25.0", "vllm@0.26.0")
    from engine.timeline import timeline

    rows = timeline("glm-5.1", "reasoning-whitespace", "vllm", first="0.22.0", last="0.26.0", bisect=True)
    changed = [r.release for r in rows if r.changed]
    assert changed == ["vllm@0.24.0"]
    assert {r.release: r.status for r in rows}["vllm@0.23.0"] == "holds"
    assert {r.release: r.status for r in rows}["vllm@0.24.0"] == "breaks"


def test_worker_is_sandboxed_and_reports_its_stubs():
    need("sglang@0.5.5")
    from engine.serving.real.backend import worker_for
    from engine.serving.real.process import network_isolation

    worker = worker_for("sglang", "0.5.5")
    assert "torch" in worker.hello["stubbed_roots"] and "libtpu" not in worker.hello["stubbed_roots"]
    if not network_isolation():
        pytest.skip("this kernel refuses unprivileged network namespaces (unshare -rn): the worker has network")
    reply = worker.ask({"op": "network_check"}, 10)
    assert reply["ok"] and reply["reachable"] is False


def test_ci_sample_of_releases_loads_and_runs_the_golden_corpus():
    import real_engines

    specs = [f"{engine}@{v}" for engine, versions in real_engines.CI_RELEASES.items() for v in versions]
    need(*specs)
    rows = [real_engines.check_release(*spec.split("@")) for spec in specs]
    assert [(r.spec, r.loads) for r in rows] == [(s, True) for s in specs]
    # every release ran the corpus cases whose parsers it registers (the verdicts are the README table's)
    assert all(r.cases == 259 and r.cases - r.missing_cases > 0 for r in rows)


# The emulations' cited lines that the real release never executed on any golden case that cites them (tracer,
# overlap check), over the pairs each pinned release still emulates. SGLang 0.5.23's DeepSeek V4 parses are its own
# code (deepseek_recipe.py), as are sglang@0.5.12's and vLLM 0.33.0's GLM, Kimi K2, DeepSeek and GPT-OSS pairs, whose
# edits the tracer reads off executed lines (the deleted emulations had cited the six vLLM lines and 0.5.12's GLM one).
STALE_CITATIONS = {
    "sglang@0.5.12": set(),
    "sglang@0.5.23": {"sglang/srt/function_call/glm47_moe_detector.py:249-298"},
    "vllm@0.33.0": set(),
}


@pytest.mark.parametrize("spec", sorted(STALE_CITATIONS))
def test_emulations_cite_lines_the_release_executes(spec):
    need(spec)
    import real_engines

    assert set(real_engines.stale_citations(spec)) == STALE_CITATIONS[spec]


def test_timeline_command_prints_every_release_and_marks_the_change(capsys):
    need("sglang@0.5.12", "sglang@0.5.12.post1", "sglang@0.5.13")
    from engine.cli import main

    assert main(["timeline", "--model", "qwen3.6", "--scenario", "tool-call", "--engine", "sglang",
                 "--from", "0.5.12", "--to", "0.5.13", "--json", "-"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [(r["release"], r["status"], r["changed"]) for r in payload["releases"]] == [
        ("sglang@0.5.12", "holds", False), ("sglang@0.5.12.post1", "holds", False), ("sglang@0.5.13", "holds", True)]


def test_releases_trace_where_cheap_and_cite_lines_they_executed():
    need("sglang@0.5.12", "vllm@0.24.0")
    from engine.serving.real.backend import AddedVocab, RealEngine

    vocab = AddedVocab(QWEN_VOCAB, frozenset())
    sglang = RealEngine("sglang", "0.5.12")
    result = sglang.parse(ANSWER_AROUND_CALL, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=TOOLS,
                          vocab=vocab)
    # reasoning_parser.py:101 `reasoning_text = splits[0]` is one expression into a new local (a "set" edit)
    assert [(e.step, e.location.path, e.location.line, e.after) for e in result.edits] == [
        ("reasoning: reasoning_text", "sglang/srt/parser/reasoning_parser.py", 101, "hmm\n"),
        ("content: text", "sglang/srt/entrypoints/openai/serving_chat.py", 1178, "Sure.\n")]
    assert all(e.location.line in sglang.last_trace["lines"][e.location.path] for e in result.edits)
    # vLLM >= 0.21's parser engine makes a traced parse cost tens of milliseconds: off unless asked
    vllm = RealEngine("vllm", "0.24.0")
    assert vllm.parse(ANSWER_AROUND_CALL, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=TOOLS,
                      vocab=vocab).edits == ()
    assert vllm.last_trace is None


def test_a_traced_parse_is_the_same_in_a_fresh_worker_and_after_other_jobs(monkeypatch):
    """What a release does once per process (imports, parsers and regexes built for a tokenizer) is not in a trace:
    the worker runs a traced job untraced first, unless it ran that very job untraced before (a cell's parse, then
    its break's). A fresh worker's trace had 2,385 edits where one that had parsed another text had 1,463, so a cause
    past the tracer's cap depended on which worker answered first."""
    need("vllm@0.33.0")
    from engine.serving.real import backend
    from engine.serving.real.backend import AddedVocab, RealEngine

    monkeypatch.setenv("DRIFT_RESULT_CACHE", "0")  # both answers from a worker
    vocab = AddedVocab(QWEN_VOCAB, frozenset())

    def traced(text: str) -> tuple[tuple, dict]:
        engine = RealEngine("vllm", "0.33.0")
        result = engine.parse(text, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=TOOLS, vocab=vocab,
                              trace=True)
        assert engine.last_trace is not None
        return result.edits, engine.last_trace

    backend.stop_workers()
    try:
        fresh_edits, fresh = traced(ANSWER_AROUND_CALL)
        backend.stop_workers()
        traced("<think>other</think>plain answer")
        later_edits, later = traced(ANSWER_AROUND_CALL)
        backend.stop_workers()
        RealEngine("vllm", "0.33.0").parse(ANSWER_AROUND_CALL, reasoning_parser="qwen3", tool_parser="qwen3_coder",
                                           tools=TOOLS, vocab=vocab, trace=False)  # the twin: no untraced run first
        twin_edits, twin = traced(ANSWER_AROUND_CALL)
    finally:
        backend.stop_workers()

    def steps(trace: dict) -> list[tuple]:  # not the values: vLLM's random_uuid draws from os.urandom
        return [(e["file"], e["line"], e["variable"], e["kind"]) for e in trace["edits"]]

    assert fresh_edits == later_edits == twin_edits and fresh_edits
    assert (fresh["lines"], steps(fresh)) == (later["lines"], steps(later)) == (twin["lines"], steps(twin))


def test_a_traced_parse_has_a_bound_of_its_own(monkeypatch):
    """The parse at a cell's break is asked again traced, up to ~40x the untraced cost: at load 8 a DeepSeek V4 parse
    passed the 20 s bound and the untraced answer stood in, so the cell's cause depended on the load."""
    need("sglang@0.5.23")
    from engine.serving.real import backend

    monkeypatch.setenv("DRIFT_ENGINE_PARSE_TIMEOUT_S", "20")
    monkeypatch.setenv("DRIFT_ENGINE_TRACED_PARSE_TIMEOUT_S", "180")
    bounds: list[float] = []
    ask = backend.ask_release

    def bounded(engine: str, version: str, job: dict, timeout_s: float, **options):
        bounds.append(timeout_s)
        return ask(engine, version, job, timeout_s, **options)

    monkeypatch.setattr(backend, "ask_release", bounded)
    engine = backend.RealEngine("sglang", "0.5.23")
    for trace in (False, True):
        result = engine.parse(ANSWER_AROUND_CALL, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=TOOLS,
                              vocab=backend.AddedVocab(QWEN_VOCAB, frozenset()), trace=trace)
        assert result.error is None
    assert bounds == [20.0, 180.0]


MISTRAL_VOCAB = {"[TOOL_CALLS]": 9, "[ARGS]": 32, "[CALL_ID]": 33}  # Tekken's ids (model_assets/mistral-small-3.2)
MISTRAL_CALLS = 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'


def test_vllm_runs_its_mistral_parser_against_the_mistral_common_it_requires():
    need("vllm@0.33.0")
    from engine.serving.real.backend import AddedVocab, RealEngine, worker_for

    required = next(r for r in fetch.requirements("vllm", "0.33.0") if r.name == "mistral_common")
    assert (str(required.specifier), required.extras) == (">=1.11.6", {"image"})  # the wheel's METADATA
    dependencies = fetch.dependency_sources("vllm", "0.33.0")
    chosen = dependencies.real["mistral_common"].spec
    assert dependencies.stubbed == {} and required.specifier.contains(chosen.partition("@")[2])
    assert (fetch.cache_dir() / "releases" / chosen / "manifest.json").exists()
    assert worker_for("vllm", "0.33.0").hello["real_dependencies"] == ["mistral_common"]
    vocab = AddedVocab(MISTRAL_VOCAB, frozenset(MISTRAL_VOCAB))
    engine = RealEngine("vllm", "0.33.0")
    whole = engine.parse(MISTRAL_CALLS, reasoning_parser=None, tool_parser="mistral", tools=TOOLS, vocab=vocab)
    streamed = engine.parse(MISTRAL_CALLS, reasoning_parser=None, tool_parser="mistral", tools=TOOLS, vocab=vocab,
                            stream=True, chunks=vocab.chunks(MISTRAL_CALLS))
    calls = [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
    # the full response strips the text before the calls, the stream sends it as it came
    assert (whole.content, [(c.name, c.arguments) for c in whole.tool_calls]) == ("Sure.", calls)
    assert (streamed.content, [(c.name, c.arguments) for c in streamed.tool_calls]) == ("Sure. ", calls)
    # MistralToolCall's 9 alphanumerics from `random`, seeded by the text: the same ids both ways, and distinct
    ids = [c.id for c in whole.tool_calls]
    assert ids == [c.id for c in streamed.tool_calls] and len(set(ids)) == 2
    assert all(i.isalnum() and len(i) == 9 for i in ids)
    assert whole.warnings == () and streamed.warnings == ()


def test_a_mistral_common_that_cannot_be_had_stays_stubbed_and_the_error_says_so(monkeypatch):
    need("vllm@0.33.0")
    from engine.serving.real import backend

    listed = fetch.list_releases
    monkeypatch.setattr(fetch, "list_releases",
                        lambda name, **kw: [] if name == "mistral_common" else listed(name, **kw))
    backend.stop_workers()
    try:
        result = backend.RealEngine("vllm", "0.33.0").parse(
            MISTRAL_CALLS, reasoning_parser=None, tool_parser="mistral", tools=TOOLS,
            vocab=backend.AddedVocab(MISTRAL_VOCAB, frozenset(MISTRAL_VOCAB)))
    finally:
        backend.stop_workers()  # the next test's worker gets the real mistral_common again
    assert result.error == (
        "TypeError: --tool-call-parser mistral cannot be used with the tokenizer of 'm': Mistral parser could not "
        "locate the tool call token in the tokenizer! at vllm/parser/parser_manager.py:92 (mistral_common is stubbed "
        "in this worker: no mistral_common release on PyPI matches vllm@0.33.0's requirement "
        "mistral_common[image]>=1.11.6)")


def test_vllm_reads_mistral_v11_calls_with_the_hub_tokenizer_from_0_20_0(capsys):
    need("vllm@0.19.1", "vllm@0.20.0")
    from engine.cli import main
    from engine.serving.real.backend import AddedVocab, RealEngine

    vocab = AddedVocab(MISTRAL_VOCAB, frozenset(MISTRAL_VOCAB))
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    old, new = (RealEngine("vllm", v).parse(text, reasoning_parser=None, tool_parser="mistral", tools=TOOLS,
                                            vocab=vocab) for v in ("0.19.1", "0.20.0"))
    # 0.19.1 parses v11 calls only through its MistralTokenizer (mistral_tool_parser.py:69-70): the call is text, so
    # its cells are unavailable (the missing piece named) rather than the Hub-tokenizer server's template errors
    assert (old.content, old.tool_calls, old.error) == (text, (), None)
    # 0.20.0 takes [ARGS] in a Hugging Face vocabulary for v11 (mistral_tool_parser.py:93-99)
    assert new.content is None and [(c.name, c.arguments) for c in new.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]
    assert main(["timeline", "--model", "mistral-small-3.2", "--scenario", "tool-call", "--engine", "vllm",
                 "--from", "0.19.1", "--to", "0.20.0", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["releases"]
    assert [(r["release"], r["status"], r["changed"]) for r in rows] == [("vllm@0.19.1", "unavailable", False),
                                                                         ("vllm@0.20.0", "breaks", True)]
    # the release strip names the missing piece (engine/serving/rendering.py's row for model_type mistral3)
    assert rows[0]["note"].startswith("vllm@0.19.1 cannot serve mistral-small-3.2: it parses the [TOOL_CALLS]name"
                                      "[ARGS]{…} calls of Mistral 3 models only through its own MistralTokenizer")


def test_a_spawned_worker_loads_while_the_caller_works_and_answers_its_first_ask(monkeypatch, tmp_path):
    need("sglang@0.5.5")
    from engine.serving.real import backend
    from engine.serving.real.results import release_fingerprint

    backend.stop_workers()
    # Its answers held in the result cache: a warm release starts no worker
    monkeypatch.setenv("DRIFT_RESULT_CACHE_DIR", str(tmp_path / "warm"))
    fingerprint = release_fingerprint("sglang@0.5.5", backend.release_dependencies("sglang", "0.5.5", offline=True))
    assert fingerprint is not None
    backend.result_cache().put(fingerprint.folder, "0" * 64, {"ok": True})
    backend.spawn_workers([("sglang", "0.5.5")])
    assert "sglang@0.5.5" not in backend._WORKERS
    monkeypatch.setenv("DRIFT_RESULT_CACHE_DIR", str(tmp_path / "cold"))  # an empty result cache: a cold release
    backend.spawn_workers([("sglang", "0.5.5"), ("vllm", "0.0.1")])  # the second is in no cache: nothing starts
    worker = backend._WORKERS["sglang@0.5.5"]
    assert set(backend._WORKERS) == {"sglang@0.5.5"} and worker.proc is not None and worker.hello == {}
    assert backend.worker_for("sglang", "0.5.5") is worker  # not a second process
    assert worker.ask({"op": "hello"}, 60)["ok"]  # the first ask waits for the start's hello, then asks
    assert worker.hello["ok"] and "torch" in worker.hello["stubbed_roots"]
    backend.stop_workers()
