"""Each tokenizer is the real one: kitoken's expected ids, single-id special tokens, character offsets."""

from __future__ import annotations

from functools import cache

import pytest
from vectors import line_cases, whole_file_case

from engine.models import build_tokenizer, load_spec


@cache
def tokenizer_of(model_id: str):
    return build_tokenizer(load_spec(model_id))[0]

# DeepSeek V3.1 keeps R1's (V3's) 129,280-token vocabulary: kitoken's r1 vectors prove it too.
VECTORS = {"qwen3.5": "qwen35", "qwen3.6": "qwen35", "deepseek-v4": "r1", "deepseek-v3.1": "r1"}


@pytest.mark.parametrize("model_id", sorted(VECTORS))
@pytest.mark.parametrize("kind", ["small", "mixed"])
def test_tokenizer_matches_kitoken_vectors(model_id: str, kind: str, shared_dir) -> None:
    tokenizer = tokenizer_of(model_id)
    cases = line_cases(shared_dir / "tokenizer-vectors", kind, VECTORS[model_id])
    assert len(cases) == {"small": 21, "mixed": 121}[kind]
    mismatches = [text for text, ids in cases if list(tokenizer.encode(text).ids) != ids]
    assert mismatches == []


@pytest.mark.parametrize("model_id", sorted(VECTORS))
def test_tokenizer_matches_kitoken_utf8_vector(model_id: str, shared_dir) -> None:
    text, ids = whole_file_case(shared_dir / "tokenizer-vectors", VECTORS[model_id])
    assert list(tokenizer_of(model_id).encode(text).ids) == ids


@pytest.mark.parametrize(("model_id", "token", "token_id"), [
    ("qwen3.6", "<think>", 248068), ("qwen3.6", "<|im_end|>", 248046), ("qwen3.6", "<tool_call>", 248058),
    ("qwen3.5", "<think>", 248068),
    ("deepseek-v4", "<think>", 128821), ("deepseek-v4", "｜DSML｜", 128825),
    ("glm-5.1", "<|observation|>", 154829), ("glm-5.1", "<think>", 154841), ("glm-5.1", "<arg_key>", 154847),
    ("qwen3-coder", "<tool_call>", 151657), ("qwen3-coder", "<|im_end|>", 151645), ("qwen3-2507", "<think>", 151667),
    ("qwen2.5", "<tool_call>", 151657), ("qwen2.5", "</tool_call>", 151658), ("qwen2.5", "<|im_end|>", 151645),
    ("deepseek-v3.1", "<think>", 128798), ("deepseek-v3.1", "</think>", 128799),
    ("deepseek-v3.1", "<｜tool▁calls▁begin｜>", 128806), ("deepseek-v3.1", "<｜tool▁sep｜>", 128814),
])
def test_special_tokens_are_single_ids(model_id: str, token: str, token_id: int) -> None:
    assert list(tokenizer_of(model_id).encode(f"a{token}b").ids)[1] == token_id
    assert list(tokenizer_of(model_id).encode(token).ids) == [token_id]


def test_glm_vocabulary_is_not_the_glm46_vectors_one(shared_dir) -> None:
    # kitoken's glm46 vectors are GLM-4.6's 151k vocabulary; GLM-4.7/5.x use a 154,856-token one, so the vectors
    # cannot prove it. The pinned sha256 and the single-id special tokens above do; this records the difference.
    cases = line_cases(shared_dir / "tokenizer-vectors", "mixed", "glm46")
    tokenizer = tokenizer_of("glm-5.1")
    assert sum(list(tokenizer.encode(text).ids) == ids for text, ids in cases) == 15
    assert all(tokenizer.decode(tokenizer.encode(text).ids) == text for text, _ in cases)


@pytest.mark.parametrize("model_id", ["qwen3.6", "glm-5.1", "deepseek-v4"])
def test_offsets_map_tokens_back_to_characters(model_id: str) -> None:
    text = "<think>\n北京 23°C 😊 naïve\n</think>\n\n{\"a\":1}"
    tokens = tokenizer_of(model_id).encode(text)
    assert tokens.offsets[0][0] == 0 and tokens.offsets[-1][1] == len(text)
    # A token that holds part of a UTF-8 character shares that character's span with its neighbour.
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(tokens.offsets, tokens.offsets[1:]))
    assert tokens.text == text
    assert "".join(text[s:e] for s, e in dict.fromkeys(tokens.offsets)) == text


def test_qwen3_and_qwen25_tokenize_text_alike() -> None:
    # No kitoken vectors cover Qwen2.5 / Qwen3 (151k vocabulary); their files are pinned by sha256 and share one
    # byte-level BPE: ordinary text gets the same ids from both, and only Qwen3 adds <think> as one token.
    qwen3, qwen25 = tokenizer_of("qwen3-coder"), tokenizer_of("qwen2.5")
    text = "def f(x):\n    return {\"北京\": x}  # naïve 😊"
    assert list(qwen3.encode(text).ids) == list(qwen25.encode(text).ids)
    assert len(qwen3.encode("<think>").ids) == 1 and len(qwen25.encode("<think>").ids) == 3
