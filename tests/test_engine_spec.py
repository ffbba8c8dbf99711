"""EngineSpec: the one parser of an engine column's name (engine/serving/spec.py), and the registry that resolves it."""

from __future__ import annotations

import pytest

from engine.errors import EngineSpecError, ExplorerError
from engine.serving.spec import EngineSpec, ParserPair

CANONICAL = ["vllm", "sglang", "raw", "bridge", "renderers", "renderers@0.1.12", "vllm@0.16.0", "sglang@0.5.12",
             "vllm@0.16.0/qwen3+hermes", "sglang@0.5.15/-+llama3", "vllm/qwen3+hermes", "real:vllm@0.33.0",
             "real:sglang@0.5.23/qwen3+qwen3_coder", "vllm@0.11.0rc1", "vllm@1.0.post1",
             # the layers (issue 27): a template runtime, proxies, server flags
             "raw@minijinja", "raw@hfjs", "vllm+minijinja", "sglang@0.5.23+hfjs", "vllm+litellm",
             "vllm+litellm@1.104.9", "raw+langchain-openai", "raw@minijinja+litellm",
             "vllm@0.31.0/qwen3+hermes+minijinja+litellm", "sglang@0.5.23[strip-thinking-cache]",
             'vllm@0.33.0[default-chat-template-kwargs={"preserve_thinking":true}]',
             'real:sglang@0.5.23[default-chat-template-kwargs={"a":1},strip-thinking-cache]/qwen3+qwen3_coder+hfjs']


@pytest.mark.parametrize("text", CANONICAL)
def test_a_canonical_name_comes_back_byte_for_byte(text: str) -> None:
    assert str(EngineSpec.parse(text)) == text


def test_the_fields_say_what_the_name_names() -> None:
    assert EngineSpec.parse("vllm@0.16.0/qwen3+-") == EngineSpec("vllm", "0.16.0", ParserPair("qwen3", None))
    assert EngineSpec.parse("real:sglang@0.5.23").real_code
    assert EngineSpec.parse("renderers").version is None
    assert EngineSpec.parse("vllm@0.16.0/qwen3+hermes").release == "vllm@0.16.0"
    assert [EngineSpec.parse(t).is_serving_engine for t in ("vllm", "sglang@0.5.1", "raw", "bridge", "renderers")] \
        == [True, True, False, False, False]
    # An empty parser name is none, written as `-`.
    assert str(EngineSpec.parse("sglang@0.5.15/+llama3")) == "sglang@0.5.15/-+llama3"


def test_the_layers_are_fields_of_the_spec() -> None:
    spec = EngineSpec.parse('vllm@0.31.0[default-chat-template-kwargs={"b": [1, 2], "a": "x,y]"}]/qwen3+hermes'
                            '+litellm@1.104.9+hfjs+langchain-openai')
    assert (spec.release, spec.parsers, spec.runtime, spec.proxies) == (
        "vllm@0.31.0", ParserPair("qwen3", "hermes"), "hfjs", ("litellm@1.104.9", "langchain-openai"))
    # A flag's JSON value is kept compact with sorted keys; a comma or bracket inside a JSON string is its own.
    assert [str(flag) for flag in spec.flags] == ['default-chat-template-kwargs={"a":"x,y]","b":[1,2]}']
    assert spec.flag("default-chat-template-kwargs").json_value() == {"a": "x,y]", "b": [1, 2]}
    assert str(spec) == ('vllm@0.31.0[default-chat-template-kwargs={"a":"x,y]","b":[1,2]}]/qwen3+hermes+hfjs'
                         '+litellm@1.104.9+langchain-openai')
    # raw's runtime is written raw@RUNTIME, however it was named.
    assert EngineSpec.parse("raw+minijinja") == EngineSpec("raw", runtime="minijinja")
    assert str(EngineSpec.parse("raw+litellm+minijinja")) == "raw@minijinja+litellm"
    assert [EngineSpec.parse(t).has_layers for t in ("vllm", "raw@hfjs", "vllm+litellm", "sglang[strip-thinking-cache]")
            ] == [False, True, True, True]


@pytest.mark.parametrize(("text", "message"), [
    ("bridge+minijinja", "bridge takes no layers"),
    ("renderers+litellm", "renderers takes no layers"),
    ("raw[strip-thinking-cache]", "server flags and a parser pair name a vLLM or SGLang release"),
    ("vllm[strip-thinking-cache]", "strip-thinking-cache is a flag of sglang, not of vllm"),
    ("sglang[no-such-flag]", "unknown server flag 'no-such-flag'; known: strip-thinking-cache"),
    ("sglang[strip-thinking-cache=1]", "strip-thinking-cache takes no value"),
    ("vllm[default-chat-template-kwargs]", "takes a JSON object after ="),
    ("vllm[default-chat-template-kwargs=[1]]", "the value of default-chat-template-kwargs is not a JSON object"),
    ("sglang[strip-thinking-cache,strip-thinking-cache]", "the flag strip-thinking-cache is named twice"),
    ("vllm[strip-thinking-cache", "the server flags' [ is not closed"),
    ("vllm[]", "[] names no server flag"),
    ("vllm+minijinja+hfjs", "one template runtime per column"),
    ("vllm+", "'' is not a layer"),
    ("vllm+../x", "'../x' is not a layer"),
    ("vllm+litellm@1.x", "'litellm@1.x' is not a layer"),
])
def test_a_malformed_layer_is_refused_in_one_sentence(text: str, message: str) -> None:
    with pytest.raises(EngineSpecError) as raised:
        EngineSpec.parse(text)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("text", "message"), [
    ("vllm@../x", "'vllm@..' is not a release: '..' is not a version as PyPI lists it"),
    ("vllm@0.16.0/../../etc", "name the parser pair as RELEASE/REASONING+TOOL"),
    ("vllm@%2e%2e", "'%2e%2e' is not a version as PyPI lists it"),
    ("vllm@0.16 .0", "'0.16 .0' is not a version as PyPI lists it"),
    ("vllm@", "'vllm@' names no version"),
    ("sglang@0.5.1\n", "'0.5.1\\n' is not a version as PyPI lists it"),
    ("v" * 10_000, "at most 200 characters, this one has 10000"),
    ("vllm@" + "1." * 150 + "1", "at most 200 characters"),
    ("nonsense", "unknown engine 'nonsense'"),
    ("raw@1", "raw takes no release"),
    ("bridge/qwen3+hermes", "bridge takes no release"),
    ("real:vllm", "real: names one release"),
    ("renderers@0.1 2", "'0.1 2' is not a release version"),
    ("vllm@0.16.0/qwen3", "name the parser pair"),
    ("vllm@0.16.0/qwen 3+hermes", "is not a parser name"),
    (7, "unknown engine of type int"),
])
def test_a_malformed_name_is_refused_in_one_sentence(text: object, message: str) -> None:
    with pytest.raises(EngineSpecError) as raised:
        EngineSpec.parse(text)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value, ValueError)  # callers that refuse an unknown release catch ValueError


def test_a_malformed_version_is_refused_before_any_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.serving import registry
    from engine.serving.real import backend, fetch

    def no_fetch(*args: object, **kwargs: object) -> None:
        raise AssertionError("a malformed name reached the release index or the cache")

    monkeypatch.setattr(fetch, "release", no_fetch)
    monkeypatch.setattr(fetch, "cached_sources", no_fetch)
    monkeypatch.setattr(backend, "release_problem", no_fetch)
    for text in ("vllm@../x", "sglang@0.5.1/../../x+y", "vllm@" + "9" * 300):
        with pytest.raises(ExplorerError):
            registry.known_engine(text)


def test_the_registry_resolves_a_spec_by_the_engines_own_names() -> None:
    from engine.serving.registry import EMULATIONS, NEWEST, PINNED, get_engine, known_engine, list_engines

    assert PINNED == tuple(list_engines()) == ("vllm@0.33.0", "sglang@0.5.23", "sglang@0.5.12")
    assert {name: cls.__name__ for name, cls in EMULATIONS.items()} == {
        "vllm@0.33.0": "VllmEmulation", "sglang@0.5.23": "SglangEmulation"}
    assert set(NEWEST) == {"vllm", "sglang"}
    engine = get_engine(EngineSpec.parse("sglang@0.5.23"))
    assert (engine.spec, engine.is_real_release, engine.release_spec) == (
        "sglang@0.5.23", False, EngineSpec("sglang", "0.5.23"))
    # a pinned release without an emulation is its own real code, pinned all the same (not `real:`)
    engine = get_engine(EngineSpec.parse("sglang@0.5.12"))
    assert (engine.spec, engine.is_real_release, engine.release_spec) == (
        "sglang@0.5.12", True, EngineSpec("sglang", "0.5.12"))
    assert known_engine("raw") == EngineSpec("raw")
    with pytest.raises(ExplorerError, match="unknown engine 'nonsense'; known: raw, bridge, renderers, sglang, vllm"):
        known_engine("nonsense")
