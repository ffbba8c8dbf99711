"""GPT-OSS harmony parsing (vLLM 0.33.0, SGLang 0.5.23 / 0.5.12) beyond the golden files: the cases those files
cannot check, bad input, and where the recorded edits point. Real GPT-OSS encoding (openai-harmony) throughout.
SGLang 0.5.23 is emulated; vLLM 0.33.0 and SGLang 0.5.12 answer from their own code (golden_serving.parse_as_served),
so only the emulation's edits are asserted."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import require_release

from engine.render.harmony import load_harmony_encoding
from engine.serving.base import EditLog
from engine.serving.emulated.sglang_0_5_23.gpt_oss import keep_markers_whole
from engine.serving.registry import EMULATIONS, get_engine
from engine.types import ParseResult

sys.path.insert(0, str(Path(__file__).parent / "conformance"))
from golden_serving import parse_as_served  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
PARSERS = {
    "vllm@0.33.0": ("openai_gptoss", "openai"),
    "sglang@0.5.23": ("gpt-oss", "gpt-oss"),
    "sglang@0.5.12": ("gpt-oss", "gpt-oss"),
}
# The releases whose GPT-OSS parsers are emulated; the others answer from their own code.
EMULATED = [spec for spec, pair in PARSERS.items() if spec in EMULATIONS and get_engine(spec).emulates(*pair)]
CALL_OPEN = '<|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query":"'


def golden(spec: str) -> tuple[list[dict], dict[str, dict]]:
    data = json.loads((GOLDEN / spec / "gpt_oss.json").read_text(encoding="utf-8"))
    return data["tools"], {case["id"].split("/", 2)[2]: case for case in data["cases"]}


def token_chunks(text: str) -> list[str]:
    """One chunk per GPT-OSS token, as the engines' detokenizers stream them (ASCII text, so they rejoin exactly)."""
    encoding = load_harmony_encoding()
    return [encoding.decode([token]) for token in encoding.encode(text, allowed_special="all")] or [""]


def run(spec: str, text: str, tools: list[dict], stream: bool = False, chunks: list[str] | None = None) -> ParseResult:
    reasoning_parser, tool_parser = PARSERS[spec]
    if spec not in EMULATED:
        require_release(spec)
        if stream and chunks is None:  # a release's code gets the deltas its detokenizer sends: one token each
            chunks = token_chunks(text)
    return parse_as_served(spec, "gpt_oss", text, reasoning_parser=reasoning_parser, tool_parser=tool_parser,
                           tools=tools, stream=stream, chunks=chunks)


def outcome(result: ParseResult) -> tuple:
    return result.reasoning, result.content, [(c.id, c.name, c.arguments) for c in result.tool_calls], result.error


@pytest.mark.parametrize(
    ("spec", "case_name"),
    [("sglang@0.5.23", "non_ascii/st"), ("sglang@0.5.23", "garbage/st")],  # real code: tests/test_parsers_golden.py
)
def test_golden_stream_whose_chunks_hold_replacement_characters(spec: str, case_name: str) -> None:
    # A token that ends inside a UTF-8 sequence streams as U+FFFD, so these chunks do not rejoin to the text and
    # EngineEmulation.parse refuses them; the family parser itself must still give the real engine's answer.
    tools, cases = golden(spec)
    case = cases[case_name]
    assert "".join(case["chunks"]) != case["text"]
    engine = get_engine(spec)
    turn = engine.family_parser(case["reasoning_parser"], case["tool_parser"]).parse(
        case["text"], tools, True, case["chunks"], EditLog(engine.origin)
    )
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.calls]
    assert {"reasoning": turn.reasoning, "content": turn.content, "tool_calls": calls} == case["expected"]


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_unfinished_message_comes_back_decoded_by_the_real_tokenizer(stream: bool) -> None:
    # harmony.py:141-159 decodes the unfinished message's tokens with the model's tokenizer. The golden file says
    # "<|start|>" here because the oracle's stand-in tokenizer decodes only special tokens.
    tools, cases = golden("vllm@0.33.0")
    text = cases["truncated_after_call_open/ns"]["text"]
    result = run("vllm@0.33.0", text, tools, stream=stream)
    assert outcome(result) == ("Let me check the weather.\n", "<|start|>ass", [], None)


def test_vllm_plain_text_is_returned_as_content() -> None:
    tools, cases = golden("vllm@0.33.0")
    result = run("vllm@0.33.0", cases["truncated_in_reasoning/ns"]["text"], tools)
    assert outcome(result) == (None, "I am still thinking about the ans", [], None)


def test_vllm_arguments_redumped_with_ascii_escapes() -> None:
    tools, cases = golden("vllm@0.33.0")
    result = run("vllm@0.33.0", cases["non_ascii/ns"]["text"], tools)
    arguments = '{"city": "Z\\u00fcrich \\u6771\\u4eac \\ud83c\\udf27"}'
    assert outcome(result) == ("Unicode.\n", None, [("chatcmpl-tool-<uuid>", "get_weather", arguments)], None)


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_without_tools_drops_calls(stream: bool) -> None:
    _, cases = golden("vllm@0.33.0")
    result = run("vllm@0.33.0", cases["call_no_content/ns"]["text"], [], stream=stream)
    assert outcome(result) == ("R.\n", None, [], None)


def test_sglang_streaming_repeats_text_that_arrived_before_the_call() -> None:
    tools, cases = golden("sglang@0.5.23")
    text = cases["canonical/ns"]["text"]
    result = run("sglang@0.5.23", text, tools, stream=True, chunks=token_chunks(text))
    call = ("call_<uuid>", "get_weather", '{"city": "Paris", "days": 3}')
    assert outcome(result) == ("Let me check the weather.\n", "\n\nI'll look it up.\n\n" * 2, [call], None)
    repeated = result.edits[0]
    assert (repeated.step, repeated.before, repeated.after) == (
        "stream_text_repeated",
        "\n\nI'll look it up.\n\n",
        "\n\nI'll look it up.\n\n" * 2,
    )
    assert (repeated.location.path, repeated.location.line) == ("sglang/srt/function_call/gpt_oss_detector.py", 85)


def test_sglang_content_edit_comes_first_and_points_at_the_detector() -> None:
    tools, cases = golden("sglang@0.5.23")
    result = run("sglang@0.5.23", cases["canonical/ns"]["text"], tools)
    assert result.content == "I'll look it up."
    assert [(e.step, str(e.location)) for e in result.edits] == [
        ("content_join_strip", "sglang/srt/function_call/gpt_oss_detector.py:58-73"),
        ("args_json_redump", "sglang/srt/function_call/gpt_oss_detector.py:229-237"),
    ]


def test_sglang_0_5_12_keeps_the_unparsed_call_in_content() -> None:
    tools, cases = golden("sglang@0.5.12")
    text = cases["undeclared_tool/ns"]["text"]
    markup = text[text.index("<|start|>") :]
    assert outcome(run("sglang@0.5.12", text, tools)) == ("R.\n", markup, [], None)
    newer = run("sglang@0.5.23", text, tools)
    assert outcome(newer) == ("R.\n", "", [], None)
    assert [(e.step, e.location.line) for e in newer.edits] == [
        ("content_join_strip", 58),
        ("unknown_tool_dropped", 221),
    ]


def test_sglang_chunks_never_split_a_marker() -> None:
    # base.default_chunks cuts every 4 characters, through markers; the detokenizer never does.
    tools, cases = golden("sglang@0.5.23")
    text = cases["canonical/ns"]["text"]
    assert keep_markers_whole(["<|ch", "anne", "l|>a", "nal", "", "ysis"]) == ["<|channel|>a", "nal", "", "ysis"]
    assert outcome(run("sglang@0.5.23", text, tools, stream=True)) == outcome(
        run("sglang@0.5.23", text, tools, stream=True, chunks=token_chunks(text))
    )


HUGE = "<|channel|>analysis<|message|>R.<|end|>" + (CALL_OPEN + "x" * 1000 + "\n") * 1000
BAD_INPUTS = {
    "garbage": "\x00\x01 <<<>>> ]]}}{ \ufffd\ufffd",
    "empty": "",
    "unbalanced": "<|end|><|end|><|channel|>final<|message|>A<|return|><|message|>" + CALL_OPEN[:-3],
    "lone_surrogate": "<|channel|>analysis<|message|>R.<|end|><|start|>assistant<|channel|>final<|message|>bad \udcff!",
    "huge": HUGE,
}
SGLANG_BAD = {  # (reasoning, non-streaming content, streaming content); no calls
    "garbage": (None, "", None),
    "empty": (None, "", None),
    "unbalanced": (None, "A", "A"),
    "lone_surrogate": ("R.", "bad \udcff!", "bad \udcff!"),
    "huge": ("R.", "", None),
}


# A release's real code is bounded by its worker's time limit (no 1 MB output), and a streamed lone surrogate cannot
# reach its worker (the chunks go as UTF-8 JSON): those two run on the emulations only.
@pytest.mark.parametrize(("spec", "name", "stream"), [
    (spec, name, stream) for spec in PARSERS for name in BAD_INPUTS for stream in (False, True)
    if spec in EMULATED or not (name == "huge" or (name == "lone_surrogate" and stream))])
def test_bad_input(spec: str, name: str, stream: bool) -> None:
    tools, _ = golden(spec)
    started = time.monotonic()
    result = run(spec, BAD_INPUTS[name], tools, stream=stream)
    assert time.monotonic() - started < 300  # a hang guard, not a speed test
    if spec.startswith("vllm"):
        # vLLM tokenises: a lone surrogate becomes U+FFFD; text outside any message comes back as content
        expected = {
            "garbage": (None, BAD_INPUTS["garbage"], []),
            "empty": (None, None, []),
            "unbalanced": (None, "A", [("chatcmpl-tool-<uuid>", "search", '{"query')]),
            "lone_surrogate": ("R.", "bad \ufffd!", []),
            "huge": ("R.", None, [("chatcmpl-tool-<uuid>", "search", HUGE[HUGE.index('{"query"') :])]),
        }[name]
    else:
        reasoning, content, streamed = SGLANG_BAD[name]
        if spec == "sglang@0.5.12" and content == "":
            content = None  # serving_chat.py:1190 sends an empty answer as null (0.5.23: "", 2997)
        expected = (reasoning, streamed if stream else content, [])
    assert outcome(result) == (*expected, None)
