"""Kimi K2.x beyond the golden corpus: bad input, a 1 MB output, edit provenance, ids, chunk effects.

Every expected value here was produced by the real vLLM 0.33.0 / SGLang 0.5.23 / 0.5.12 parser classes, driven the
way tests/conformance/oracle_runner.py drives them (the chunks special-token-alone, other text in 4-character pieces),
except where a test says it follows the real serving code instead of that glue. SGLang 0.5.23 is emulated; vLLM 0.33.0
and SGLang 0.5.12 answer from their own code (golden_serving.parse_as_served), so their edits are not asserted here.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import require_release

from engine.serving.registry import EMULATIONS, get_engine

GOLDEN = Path(__file__).parent / "golden"
sys.path.insert(0, str(Path(__file__).parent / "conformance"))
from golden_serving import parse_as_served  # noqa: E402

TOOLS = json.loads((GOLDEN / "vllm@0.33.0" / "kimi_k2.json").read_text(encoding="utf-8"))["tools"]
SPECIALS = (
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|im_end|>",
)
SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
ENGINES = ("vllm@0.33.0", "sglang@0.5.23", "sglang@0.5.12")
EMULATED = tuple(spec for spec in ENGINES if spec in EMULATIONS and get_engine(spec).emulates("kimi_k2", "kimi_k2"))


def oracle_chunks(text: str) -> list[str]:
    """As the conformance corpus streams: each special token alone, other text in pieces of 4 characters."""
    chunks: list[str] = []
    for piece in re.split("(" + "|".join(map(re.escape, SPECIALS)) + ")", text):
        if piece in SPECIALS:
            chunks.append(piece)
        elif piece:
            chunks += [piece[i : i + 4] for i in range(0, len(piece), 4)]
    return chunks or [""]


def run(spec: str, text: str, stream: bool, chunks: list[str] | None = None, **request: object):
    if spec not in EMULATED:
        require_release(spec)
    return parse_as_served(spec, "kimi_k2", text, reasoning_parser="kimi_k2", tool_parser="kimi_k2", tools=TOOLS,
                           stream=stream, chunks=(chunks or oracle_chunks(text)) if stream else None,
                           **request)  # type: ignore[arg-type]


def outcome(result) -> tuple:
    return result.reasoning, result.content, [(c.id, c.name, c.arguments) for c in result.tool_calls], result.error


GARBAGE = "\x00\x01 <<<>>> ]]}}{ \ufffd\ufffd"
UNBALANCED = "</think></think>" + SECTION + CALL + CALL + "functions.search:0" + ARGS + "{"
SURROGATE = "R.</think>bad \udcff bytes"
WHOLE_UNBALANCED = UNBALANCED[len("</think>") :]
BAD_INPUTS = {
    # (text, {engine: (non-streaming outcome, streaming outcome)})
    "garbage": (
        GARBAGE,
        {
            "vllm@0.33.0": ((GARBAGE, None, [], None),) * 2,
            "sglang@0.5.23": ((GARBAGE, "", [], None), (GARBAGE, None, [], None)),
            "sglang@0.5.12": ((GARBAGE, None, [], None),) * 2,  # serving_chat.py:1190: "" goes out as null
        },
    ),
    "unbalanced": (
        UNBALANCED,
        {
            # a second call begin inside the header is text of the TOOL_NAME state: it becomes part of the name
            "vllm@0.33.0": ((None, None, [(CALL + "functions.search:0", CALL + "functions.search", "{")], None),) * 2,
            "sglang@0.5.23": (
                (None, "</think>", [], None),
                (None, "</think>", [("functions.search:0", "search", "{}")], None),
            ),
            "sglang@0.5.12": (
                (None, WHOLE_UNBALANCED, [], None),
                (None, "</think>", [("functions.search:0", "search", "{}")], None),
            ),
        },
    ),
    "lone_surrogate": (
        SURROGATE,
        {spec: (("R.", "bad \udcff bytes", [], None),) * 2 for spec in ENGINES},
    ),
    "empty": (
        "",
        {
            "vllm@0.33.0": ((None, None, [], None),) * 2,
            "sglang@0.5.23": ((None, "", [], None), (None, None, [], None)),
            "sglang@0.5.12": ((None, None, [], None),) * 2,
        },
    ),
}


# A streamed lone surrogate cannot reach a release's worker (its chunks go as UTF-8 JSON): emulations only.
@pytest.mark.parametrize(("spec", "name", "stream"), [
    (spec, name, stream) for spec in ENGINES for name in BAD_INPUTS for stream in (False, True)
    if not (name == "lone_surrogate" and stream and spec not in EMULATED)])
def test_bad_input_exact(spec: str, name: str, stream: bool) -> None:
    text, expected = BAD_INPUTS[name]
    assert outcome(run(spec, text, stream)) == expected[spec][int(stream)]


def test_one_megabyte_call_is_parsed_whole_and_bounded() -> None:
    """The emulation (a release's real code is bounded by its worker's time limit, tests/test_hostile_workers.py)."""
    value = "x" * 1_000_000
    arguments = '{"query":"' + value + '"}'
    text = "</think>" + SECTION + CALL + "functions.search:0" + ARGS + arguments + CALL_END + SECTION_END
    call = [("functions.search:0", "search", '{"query":"' + value + '"}')]
    expected = {"sglang@0.5.23": ((None, "", call, None), (None, None, call, None))}
    for spec in expected:
        for stream in (False, True):
            started = time.monotonic()
            # default chunks: 4-character pieces that also cut the special tokens, which the emulation re-joins
            result = get_engine(spec).parse(
                text, reasoning_parser="kimi_k2", tool_parser="kimi_k2", tools=TOOLS, stream=stream
            )
            assert time.monotonic() - started < 300, (spec, stream)  # a hang guard: linear, about 5 s on 2 cores idle
            assert outcome(result) == expected[spec][int(stream)], (spec, stream)


def edit(result, step: str):
    return next(e for e in result.edits if e.step == step)


def test_vllm_streaming_records_the_suppressed_text_after_the_section() -> None:
    text = "R.</think>Hi." + SECTION + CALL + "functions.search:0" + ARGS + '{"query":"q"}' + CALL_END + SECTION_END
    result = run("vllm@0.33.0", text + "\nbye", stream=True)
    assert outcome(result) == ("R.", "Hi.", [("functions.search:0", "search", '{"query":"q"}')], None)


def test_sglang_edits_name_each_versions_lines() -> None:
    text = "\n R. \n</think>\n Hi." + SECTION + CALL + "functions.search:0" + ARGS + ' {"query":"q"} ' + CALL_END
    new = run("sglang@0.5.23", text + SECTION_END + "bye", stream=False)
    assert outcome(new) == ("\n R. \n", "\n Hi.", [("functions.search:0", "search", '{"query":"q"}')], None)
    assert str(edit(new, "content_before_section").location) == "sglang/srt/function_call/kimik2_detector.py:205-206"
    trim = edit(new, "args_ws_trim")
    assert (trim.before, trim.after) == (' {"query":"q"} ', '{"query":"q"}')
    old = run("sglang@0.5.12", text + SECTION_END + "bye", stream=False)
    assert outcome(old) == ("R. \n", "Hi.", [("functions.search:0", "search", '{"query":"q"}')], None)


def parse_with(spec: str, text: str, stream: bool, **request: object) -> tuple:
    return outcome(run(spec, text, stream, **request))


def test_call_ids_model_header_versus_serving_layer() -> None:
    text = "R.</think>" + SECTION + CALL + "functions.get_weather:5" + ARGS + '{"city":"Oslo"}' + CALL_END + SECTION_END
    ids = {
        (spec, stream): parse_with(spec, text, stream, history_tool_calls=3)[2][0][0]
        for spec in ENGINES
        for stream in (False, True)
    }
    assert ids == {
        # vLLM keeps the model's header; the history count never reaches the engine that makes ids
        ("vllm@0.33.0", False): "functions.get_weather:5",
        ("vllm@0.33.0", True): "functions.get_weather:5",
        # SGLang rebuilds it: history + position (serving_chat.py:3129-3147)
        ("sglang@0.5.23", False): "functions.get_weather:3",
        ("sglang@0.5.23", True): "functions.get_weather:3",
        # 0.5.12's non-streaming path adds the model's :N instead (kimik2_detector.py:186, serving_chat.py:1288);
        # real serving code, where the conformance glue would give :3
        ("sglang@0.5.12", False): "functions.get_weather:8",
        ("sglang@0.5.12", True): "functions.get_weather:3",
    }


def test_bare_counter_id_vllm_drops_the_call_sglang_infers_the_tool() -> None:
    text = "R.</think>" + SECTION + CALL + "3" + ARGS + '{"city":"Oslo","days":2}' + CALL_END + SECTION_END
    for stream in (False, True):
        assert run("vllm@0.33.0", text, stream).tool_calls == ()
        call = run("sglang@0.5.23", text, stream).tool_calls[0]
        assert (call.id, call.name) == ("functions.get_weather:0", "get_weather")


def test_vllm_streaming_loses_reasoning_space_before_a_held_marker_prefix() -> None:
    text = "Thinking ans <"
    assert run("vllm@0.33.0", text, stream=False).reasoning == "Thinking ans <"
    # the space is held back as trailing reasoning whitespace; the "<" is released by finish() unstripped
    assert run("vllm@0.33.0", text, stream=True, chunks=["Thinking ", "ans ", "<"]).reasoning == "Thinking ans<"


def test_vllm_thinking_off_drops_think_tags_as_unknown_special_tokens() -> None:
    text = "R.</think>Hi" + SECTION + CALL + "functions.search:0" + ARGS + '{"query":"q"}' + CALL_END + SECTION_END
    call = [("functions.search:0", "search", '{"query":"q"}')]
    for stream in (False, True):
        assert parse_with("vllm@0.33.0", text, stream, chat_template_kwargs={"thinking": False}) == (
            None,
            "R.Hi",
            call,
            None,
        )


@pytest.mark.parametrize("spec", EMULATED)  # the emulation's default chunking (EngineEmulation.parse)
def test_default_chunks_never_split_a_special_token(spec: str) -> None:
    """Without chunks the engine streams 4-character pieces; a piece that would cut a special token is re-joined (one
    token id never spans two deltas). The calls come out as in the golden stream."""
    data = json.loads((GOLDEN / spec / "kimi_k2.json").read_text(encoding="utf-8"))
    case = next(c for c in data["cases"] if c["id"].endswith("/parallel_calls/st"))
    result = get_engine(spec).parse(case["text"], reasoning_parser="kimi_k2", tool_parser="kimi_k2", tools=TOOLS,
                                    stream=True)
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in result.tool_calls]
    assert {"reasoning": result.reasoning, "content": result.content, "tool_calls": calls} == case["expected"]
