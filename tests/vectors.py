"""Reading the kitoken tokenizer vectors in ../shared/tokenizer-vectors (see its README)."""

from __future__ import annotations

from pathlib import Path


def _unescape(line: str) -> str:
    # In the line-per-input files a literal \n stands for a newline and a literal \s for a (trailing) space.
    return line.replace("\\n", "\n").replace("\\s", " ")


def line_cases(vectors: Path, kind: str, name: str) -> list[tuple[str, list[int]]]:
    inputs = (vectors / f"tests_data_{kind}_input.txt").read_text(encoding="utf-8").split("\n")
    expected = (vectors / f"tests_data_tokenizers_{kind}_tokens_{name}.txt").read_text(encoding="utf-8").split("\n")
    cases = []
    for text, ids in zip(inputs, expected, strict=True):
        cases.append((_unescape(text), [int(x) for x in ids.split(",") if x.strip()]))
    return cases


def whole_file_case(vectors: Path, name: str) -> tuple[str, list[int]]:
    text = (vectors / "tests_data_utf8_input.txt").read_text(encoding="utf-8")
    ids = (vectors / f"tests_data_tokenizers_utf8_tokens_{name}.txt").read_text(encoding="utf-8")
    return text, [int(x) for x in ids.split(",") if x.strip()]
