"""Every golden case from the real parsers, byte for byte, through what serves it: the pinned release's emulation
(offline), or for a release or family without one (sglang@0.5.12; vLLM 0.33.0's GLM, Kimi K2, DeepSeek, GPT-OSS) the
release's own code as the golden files were written (tests/conformance/golden_serving.py; warm from the result cache).

Golden files come from tests/conformance/generate.py. A case whose `known_gap` is set is a strict xfail naming why.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import require_release

from engine.serving.emulated.sglang_0_5_23 import deepseek_recipe
from engine.serving.registry import EMULATIONS, for_parsers, get_engine, list_engines

GOLDEN = Path(__file__).parent / "golden"
sys.path.insert(0, str(Path(__file__).parent / "conformance"))


def _cases() -> list:
    params = []
    for path in sorted(GOLDEN.glob("*@*/*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for case in data["cases"]:
            marks = [pytest.mark.xfail(reason=case["known_gap"], strict=True)] if case.get("known_gap") else []
            tools = case["tools"] if "tools" in case else data["tools"]  # a case may declare none
            case = {**case, "family": data["family"]}  # the corpus family (golden_serving.run_case reads it)
            params.append(pytest.param(data["engine"], tools, case, id=f"{data['engine']}/{case['id']}", marks=marks))
    return params


def _normalised(result) -> dict:
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in result.tool_calls]
    return {"reasoning": result.reasoning, "content": result.content, "tool_calls": calls}


@pytest.mark.parametrize(("spec", "tools", "case"), _cases())
def test_golden(spec: str, tools: list[dict], case: dict) -> None:
    engine = for_parsers(get_engine(spec), case["reasoning_parser"], case["tool_parser"])
    if engine.is_real_release:  # not emulated: the release's own code, driven as generate.py drives it
        import golden_serving

        require_release(spec)
        result = golden_serving.run_case(engine, {**case, "tools": tools})
        if case["error"] is not None:
            assert result.error is not None
        else:
            assert golden_serving.normalised(result) == case["expected"]
        return
    if deepseek_recipe.owns(engine.version, case["tool_parser"]):
        # not emulated: the release's own code (engine/serving/emulated/sglang_0_5_23/deepseek_recipe.py)
        require_release(spec)
    result = engine.parse(
        case["text"],
        reasoning_parser=case["reasoning_parser"],
        tool_parser=case["tool_parser"],
        tools=tools,
        stream=case["mode"] == "st",
        chunks=case["chunks"],
        chat_template_kwargs=case["chat_template_kwargs"],
        history_tool_calls=case["history_tool_calls"],
    )
    if case["error"] is not None:
        assert result.error is not None
    else:
        assert _normalised(result) == case["expected"]


def test_golden_files_cover_every_engine() -> None:
    assert {p.name for p in GOLDEN.glob("*@*")} == set(list_engines())


@pytest.mark.parametrize("spec", ["vllm@0.33.0", "sglang@0.5.23", "sglang@0.5.12"])
def test_unknown_parser_names_the_engine_and_known_names(spec: str) -> None:
    if spec not in EMULATIONS:
        require_release(spec)
    with pytest.raises(ValueError, match=spec) as info:
        get_engine(spec).parse("x", reasoning_parser="nope", tool_parser=None)
    assert "qwen3" in str(info.value)


def test_bare_engine_name_is_newest() -> None:
    assert get_engine("vllm").version == "0.33.0"
    assert get_engine("sglang").version == "0.5.23"


BAD_INPUTS = {
    "garbage": "\x00\x01 <<<>>> ]]}}{ \ufffd\ufffd",
    "empty": "",
    "unbalanced": "</think></think><tool_call><tool_call><function=x><parameter=a>",
    "lone_surrogate": "R.</think>bad \udcff bytes",
    "huge": "</think>" + ("<tool_call>\n<function=search>\n<parameter=query>\n" + "x" * 1000 + "\n") * 1000,
}


@pytest.mark.parametrize("spec", list(EMULATIONS))  # a release's real code is bounded by its worker's time limit
@pytest.mark.parametrize("name", list(BAD_INPUTS))
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_returns_quickly(spec: str, name: str, stream: bool) -> None:
    tool_parser = "qwen3_coder"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
            },
        }
    ]
    started = time.monotonic()
    result = get_engine(spec).parse(
        BAD_INPUTS[name], reasoning_parser="qwen3", tool_parser=tool_parser, tools=tools, stream=stream
    )
    # bound, not speed: SGLang's own parameter regex (lookahead alternatives) is superlinear on a 1 MB call body,
    # and the emulation uses the same pattern so its result stays exact; ~6 s on 2 cores.
    assert time.monotonic() - started < 300  # ~6 s idle; generous for a loaded machine
    assert result.error is None


def test_vllm_request_side() -> None:
    messages = [
        {
            "role": "assistant",
            "reasoning_content": "r",
            "content": "",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "[1]"}}],
        },
        {"role": "assistant", "content": "x", "tool_calls": []},
    ]
    prep = get_engine("vllm@0.33.0").prepare_request(messages, None)
    assert prep.error is None
    assert prep.messages[0]["reasoning"] == prep.messages[0]["reasoning_content"] == "r"
    assert prep.messages[0]["tool_calls"][0]["function"]["arguments"] == {}
    assert "tool_calls" not in prep.messages[1]
    assert messages[0]["reasoning_content"] == "r"  # input untouched


def test_sglang_request_side_rejects_invalid_arguments() -> None:
    bad = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{bad"}}],
        }
    ]
    assert get_engine("sglang@0.5.23").prepare_request(bad, None).error
    good = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
        }
    ]
    prep = get_engine("sglang@0.5.23").prepare_request(good, None)
    assert prep.error is None and prep.messages[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_qwen3_coerces_by_the_shared_schema_rules(stream: bool) -> None:
    # parser_engine.py:437-462 reads types as extract_types_from_schema does: enum value types and anyOf branches too,
    # and aliases ("float"). Expected values from the real vLLM 0.33.0 parser (tests/conformance/oracle_runner.py).
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {"type": "object", "properties": {
        "n": {"enum": [1, 2, 3]}, "m": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "f": {"type": "float"},
        "o": {"type": "object", "properties": {"k": {"type": "integer"}}}}}}}]
    text = ("R.\n</think>\n\n<tool_call>\n<function=pick>\n<parameter=n>\n2\n</parameter>\n<parameter=m>\n7\n"
            "</parameter>\n<parameter=f>\n1.5\n</parameter>\n<parameter=o>\n{\"k\": \"4\"}\n</parameter>\n</function>\n"
            "</tool_call>")
    result = get_engine("vllm@0.33.0").parse(text, reasoning_parser="qwen3", tool_parser="qwen3_coder", tools=tools,
                                             stream=stream)
    assert [c.arguments for c in result.tool_calls] == ['{"n": 2, "m": 7, "f": 1.5, "o": {"k": "4"}}']
