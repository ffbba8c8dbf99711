"""DeepSeek DSML beyond the golden corpus: bad input, a 1 MB output, the V3.2 names, edit locations.

Every expected value below was produced by running the real vLLM 0.33.0 / SGLang 0.5.12 parser classes on the same
input (the vLLM streaming no-tools case follows stream_processor.py, which drops calls the earlier oracle glue kept;
SGLang 0.5.12's streamed unclosed call follows its serving_chat.py _check_for_unstreamed_tool_args). SGLang 0.5.23
with `deepseekv4` is not emulated: it parses through deepseek-recipe in the release's own code, which these tests run
(engine/serving/emulated/sglang_0_5_23/deepseek_recipe.py; its rows are what that code returned, with the corpus's
thinking request); `deepseekv32` on 0.5.23 is still the emulation. vLLM 0.33.0 and SGLang 0.5.12 have no DeepSeek
emulation: their rows are answered by the release's own code (golden_serving.parse_as_served), so only SGLang 0.5.23's
edits are asserted here.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import require_release

from engine.serving.registry import for_parsers, get_engine
from engine.types import ParseResult

sys.path.insert(0, str(Path(__file__).parent / "conformance"))
from golden_serving import parse_as_served  # noqa: E402

D = "｜DSML｜"
SPECIALS = ("<think>", "</think>", D)
PAIRS = {
    "vllm@0.33.0": ("deepseek_v4", "deepseek_v4"),
    "sglang@0.5.23": ("deepseek-v4", "deepseekv4"),
    "sglang@0.5.12": ("deepseek-v4", "deepseekv4"),
}
VLLM_ID, SGLANG_ID = "chatcmpl-tool-<uuid>", "call_<uuid>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
    },
]
WEATHER = (
    f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
    f'<{D}parameter name="days" string="false">3</{D}parameter>\n</{D}invoke>'
)
WEATHER_ARGS = '{"city": "Paris", "days": 3}'


def token_chunks(text: str, width: int = 4) -> list[str]:
    """Special tokens alone, other text in `width`-character pieces (the golden corpus's streaming chunks)."""
    chunks: list[str] = []
    for piece in re.split("(" + "|".join(map(re.escape, SPECIALS)) + ")", text):
        if piece in SPECIALS:
            chunks.append(piece)
        elif piece:
            chunks.extend(piece[i : i + width] for i in range(0, len(piece), width))
    return chunks or [""]


def parse(spec: str, text: str, stream: bool, chunks: list[str] | None = None, **names: str | None) -> ParseResult:
    reasoning_parser, tool_parser = PAIRS[spec]
    tool_parser = names.get("tool_parser", tool_parser)
    kwargs = None
    if spec == "sglang@0.5.23" and tool_parser == "deepseekv4":
        require_release(spec)
        kwargs = {"thinking": True}  # the recipe path reads it from the request, as the golden corpus asks
    elif spec.startswith("sglang") and names.get("reasoning_parser") == "deepseek-v3":
        kwargs = {"thinking": True}  # SGLang splits deepseek-v3 reasoning only for a thinking request
    reasoning_parser = names.get("reasoning_parser", reasoning_parser)
    if for_parsers(get_engine(spec), reasoning_parser, tool_parser).is_real_release:
        require_release(spec)
    return parse_as_served(spec, "deepseek_v4", text, reasoning_parser=reasoning_parser, tool_parser=tool_parser,
                           tools=names.get("tools", TOOLS),  # type: ignore[arg-type]
                           stream=stream, chunks=chunks if chunks is not None else token_chunks(text),
                           chat_template_kwargs=kwargs)


def outcome(result: ParseResult) -> tuple:
    return result.reasoning, result.content, [(c.id, c.name, c.arguments) for c in result.tool_calls], result.error


GARBAGE = "\x00\x01 <<<>>> ]]}}{ \ufffd\ufffd"
UNBALANCED = (
    f'</think></think><{D}tool_calls><{D}tool_calls><{D}invoke name="get_weather">'
    f'<{D}parameter name="city" string="true">'
)
SURROGATE = "R.</think>bad \udcff bytes"
RECIPE_FAILED = "sglang@0.5.23's own code (DeepSeek V4 through deepseek-recipe) failed: "
BAD_INPUT_CASES = [
    # (engine, input, stream, (reasoning, content, calls, error))
    ("vllm@0.33.0", GARBAGE, False, (GARBAGE, None, [], None)),
    ("vllm@0.33.0", GARBAGE, True, (GARBAGE, None, [], None)),
    ("vllm@0.33.0", "", False, (None, None, [], None)),
    ("vllm@0.33.0", "", True, (None, None, [], None)),
    ("vllm@0.33.0", UNBALANCED, False, (None, None, [(VLLM_ID, "get_weather", "{}")], None)),
    ("vllm@0.33.0", UNBALANCED, True, (None, None, [(VLLM_ID, "get_weather", '{"city": "')], None)),
    ("vllm@0.33.0", SURROGATE, False, ("R.", "bad \udcff bytes", [], None)),
    # deepseek-recipe on the real tokenizer's ids: an output ending in two U+FFFD comes back without them streamed and
    # without any reasoning whole; the unclosed call is returned with the arguments seen so far
    ("sglang@0.5.23", GARBAGE, False, (None, "", [], None)),
    ("sglang@0.5.23", GARBAGE, True, (GARBAGE[:-2], None, [], None)),
    ("sglang@0.5.23", "", False, (None, "", [], None)),
    ("sglang@0.5.23", "", True, (None, None, [], None)),
    ("sglang@0.5.23", UNBALANCED, False, (None, "", [(SGLANG_ID, "get_weather", '{"city": "')], None)),
    ("sglang@0.5.23", UNBALANCED, True, (None, None, [(SGLANG_ID, "get_weather", '{"city": "')], None)),
    # a lone surrogate is no text a tokenizer can turn into the ids this path parses: one sentence
    ("sglang@0.5.23", SURROGATE, False, (None, None, [], RECIPE_FAILED + "TypeError: TextInputSequence must be str")),
    ("sglang@0.5.23", SURROGATE, True, (None, None, [], RECIPE_FAILED + "TypeError: TextInputSequence must be str")),
    ("sglang@0.5.12", GARBAGE, False, (GARBAGE, None, [], None)),  # serving_chat.py:1190: "" goes out as null
    ("sglang@0.5.12", "", True, (None, None, [], None)),
    # 0.5.12 kept the whole text when no call parsed, and streamed the unclosed invoke's name; the stream's end
    # JSON-dumps its arguments string "{}" (serving_chat.py:1690-1699) and, nothing having been streamed, sends it all
    ("sglang@0.5.12", UNBALANCED, False, (None, UNBALANCED.removeprefix("</think>"), [], None)),
    ("sglang@0.5.12", UNBALANCED, True, (None, "</think>", [(SGLANG_ID, "get_weather", '"{}"')], None)),
    # (a streamed lone surrogate cannot reach a release's worker: its chunks go as UTF-8 JSON)
]


@pytest.mark.parametrize(("spec", "text", "stream", "expected"), BAD_INPUT_CASES)
def test_bad_input_gives_the_engines_answer(spec: str, text: str, stream: bool, expected: tuple) -> None:
    assert outcome(parse(spec, text, stream)) == expected


BIG_VALUE = ('lorem ipsum <b>bold</b> "q" ' * 40000)[:1_000_000]
BIG = (
    f'Plan.\n</think>\n\nSearching.\n\n<{D}tool_calls>\n<{D}invoke name="search">\n'
    f'<{D}parameter name="query" string="true">{BIG_VALUE}</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>'
)
BIG_CASES = [
    ("vllm@0.33.0", False, "Plan.", "\n\nSearching.\n\n"),
    # 64 KB ordinary chunks: "</think>" arrives as text, so once token ids flow it is not a terminal
    ("vllm@0.33.0", True, "Plan.\n</think>\n\nSearching.", None),
    ("sglang@0.5.23", False, "Plan.", "Searching."),
    ("sglang@0.5.23", True, "Plan.", "Searching."),
    ("sglang@0.5.12", False, "Plan.\n", "Searching."),
    ("sglang@0.5.12", True, "Plan.", None),
]


@pytest.mark.parametrize(("spec", "stream", "reasoning", "content"), BIG_CASES)
def test_one_megabyte_call(spec: str, stream: bool, reasoning: str, content: str | None) -> None:
    chunks = [BIG[i : i + 65536] for i in range(0, len(BIG), 65536)]
    started = time.monotonic()
    result = parse(spec, BIG, stream, chunks)
    assert time.monotonic() - started < 300  # hang guard only (generous for a loaded machine)
    call_id = VLLM_ID if spec.startswith("vllm") else SGLANG_ID
    expected_args = json.dumps({"query": BIG_VALUE}, ensure_ascii=False)
    assert outcome(result) == (reasoning, content, [(call_id, "search", expected_args)], None)


V32_TEXT = f"R.</think>Hi\n\n<{D}function_calls>\n{WEATHER}\n</{D}function_calls>"


@pytest.mark.parametrize(
    ("spec", "names", "stream", "expected"),
    [
        # ｜DSML｜ is not one of the tokenizer's special tokens, so the V4 reasoning pass keeps the V3.2 wrapper and
        # the V3.2 tool pass parses the call, whole or streamed (checked against the real parser with the real flags)
        (
            "vllm@0.33.0",
            ("deepseek_v4", "deepseek_v32"),
            False,
            ("R.", "Hi\n\n", [(VLLM_ID, "get_weather", WEATHER_ARGS)], None),
        ),
        (
            "vllm@0.33.0",
            ("deepseek_v4", "deepseek_v32"),
            True,
            ("R.", "Hi\n\n", [(VLLM_ID, "get_weather", WEATHER_ARGS)], None),
        ),
        (
            "sglang@0.5.23",
            ("deepseek-v3", "deepseekv32"),
            False,
            ("R.", "Hi", [(SGLANG_ID, "get_weather", WEATHER_ARGS)], None),
        ),
        (
            "sglang@0.5.23",
            ("deepseek-v3", "deepseekv32"),
            True,
            ("R.", "Hi", [(SGLANG_ID, "get_weather", WEATHER_ARGS)], None),
        ),
        (
            "sglang@0.5.12",
            ("deepseek-v3", "deepseekv32"),
            True,
            ("R.", "Hi\n\n\n", [(SGLANG_ID, "get_weather", WEATHER_ARGS)], None),
        ),
    ],
)
def test_v32_function_calls(spec: str, names: tuple[str, str], stream: bool, expected: tuple) -> None:
    result = parse(spec, V32_TEXT, stream, reasoning_parser=names[0], tool_parser=names[1])
    assert outcome(result) == expected


WHOLE_TAGS = f"R.</think>Hi\n\n<{D}tool_calls>\n{WEATHER}\n</{D}tool_calls>"
WHOLE_TAG_CHUNKS = ["R.", "</think>", "Hi\n\n", f"<{D}tool_calls>\n", WEATHER[:30], WEATHER[30:70], WEATHER[70:]]
WHOLE_TAG_CHUNKS.append(f"\n</{D}tool_calls>")


@pytest.mark.parametrize(
    ("spec", "content", "call_id"),
    [("vllm@0.33.0", "Hi\n\n", VLLM_ID), ("sglang@0.5.23", "Hi", SGLANG_ID), ("sglang@0.5.12", "Hi\n\n", SGLANG_ID)],
)
def test_streamed_call_when_dsml_arrives_as_text(spec: str, content: str, call_id: str) -> None:
    result = parse(spec, WHOLE_TAGS, True, WHOLE_TAG_CHUNKS)
    assert outcome(result) == ("R.", content, [(call_id, "get_weather", WEATHER_ARGS)], None)


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_without_tools_returns_no_calls(stream: bool) -> None:
    # message_assembly.py / stream_processor.py keep calls only when the request declares tools
    result = parse("vllm@0.33.0", WHOLE_TAGS, stream, WHOLE_TAG_CHUNKS, tools=[])
    assert outcome(result) == ("R.", "Hi\n\n", [], None)


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_thinking_off_starts_in_content(stream: bool) -> None:
    require_release("vllm@0.33.0")
    text = "R.</think>Answer <think>x</think> end."
    chunks = ["R.", "</think>", "Answ", "er ", "<think>", "x", "</think>", " end."]
    result = parse_as_served("vllm@0.33.0", "deepseek_v4", text, reasoning_parser="deepseek_v4",
                             tool_parser="deepseek_v4", tools=TOOLS, stream=stream, chunks=chunks,
                             chat_template_kwargs={"thinking": False})
    # a bare </think> in content is absorbed; a later <think> block is still reasoning
    assert outcome(result) == ("x", "R.Answer  end.", [], None)


@pytest.mark.parametrize(
    ("spec", "tool_parser", "error"),
    [
        ("sglang@0.5.23", "deepseekv3", NotImplementedError),
        ("sglang@0.5.23", "deepseek-v4", ValueError),
    ],
)
def test_unemulated_names_say_so(spec: str, tool_parser: str, error: type[Exception]) -> None:
    with pytest.raises(error, match=tool_parser):
        parse(spec, WHOLE_TAGS, False, tool_parser=tool_parser)


def _edit(result: ParseResult, step: str) -> tuple:
    edit = next(e for e in result.edits if e.step == step)
    return edit.location.origin, edit.location.path, edit.location.line, edit.before, edit.after


def test_edits_point_at_the_real_lines() -> None:
    # Only the tokenizer's special tokens (bos, eos) can be dropped: a stray <｜begin▁of▁sentence｜> is.
    bos = "<｜begin▁of▁sentence｜>"
    streamed = parse("vllm@0.33.0", f"R.</think>Hi{bos} there", True, ["R.", "</think>", "Hi", bos, " the", "re"])
    assert streamed.content == "Hi there"
    padded = f'R.</think><{D}function_calls>\n<{D}invoke name="search">\n<{D}parameter name="query" string="true">  x  '
    padded += f"</{D}parameter>\n</{D}invoke>\n</{D}function_calls>"
    v32 = parse("sglang@0.5.23", padded, False, reasoning_parser="deepseek-v3", tool_parser="deepseekv32")
    assert _edit(v32, "param_value_strip") == (
        "sglang 0.5.23",
        "sglang/srt/function_call/deepseekv32_detector.py",
        171,
        "  x  ",
        "x",
    )
    assert parse("sglang@0.5.12", "R.</think>\n\nAnswer. ", False).content == "Answer."
