"""How a golden corpus case runs through a release's real serving code (engine/serving/real): the vocabulary its
parsers see, the request around it, and the fields the golden files record. Used by generate.py (which writes the
golden files from it) and benchmarks/real_engines.py (which checks every release against them)."""

from __future__ import annotations

import dataclasses
import functools
import re

import corpus

from engine.serving.real.backend import AddedVocab, RealEngine
from engine.serving.registry import for_parsers, get_engine
from engine.types import ToolCall

_RANDOM_ID = re.compile(r"^(chatcmpl-tool-|call_)[0-9a-f]{16,32}$")


def normalised(result) -> dict | None:
    """The fields the golden files record, ids normalised as the oracle did."""
    if result.error:
        return None
    return {"reasoning": result.reasoning, "content": result.content,
            "tool_calls": [{"id": _RANDOM_ID.sub(r"\1<uuid>", c.id) if c.id is not None else None, "name": c.name,
                            "arguments": c.arguments}
                           for c in result.tool_calls]}


def request_kwargs(engine: str, family: str) -> dict | None:
    """The request's chat_template_kwargs for a corpus case. The corpus's DeepSeek prompts end in <think>: the request
    that renders them asks for thinking, and SGLang 0.5.23's recipe path reads that flag from the request
    (serving_chat.py _thinking_requested; SGLANG_DEFAULT_THINKING is off), so the SGLang cases carry it."""
    return {"thinking": True} if engine == "sglang" and family == "deepseek_v4" else None


def run_case(engine: RealEngine, case: dict, *, trace: bool = False):
    family = corpus.FAMILIES[case["family"]]
    recipe = engine.name == "sglang" and family.name == "deepseek_v4"
    model_vocab = _model_vocab(family.name)
    # DeepSeek V4's 1,283 added tokens make vLLM >= 0.25 build its grammar tables for a second a request: the
    # corpus's own list there, except for the recipe path that needs the whole tokenizer
    merged = model_vocab.ids if len(model_vocab.ids) < 200 else {}
    ids = {**merged, **family.special_tokens}
    special = ((model_vocab.special & set(merged)) - set(family.special_tokens)) | \
        (set(family.special_tokens) - family.not_special)
    vocab = AddedVocab(ids, frozenset(special), model_vocab.tokenizer_json if recipe else None)
    return engine.parse(case["text"], reasoning_parser=case["reasoning_parser"], tool_parser=case["tool_parser"],
                        tools=case["tools"], chunks=case["chunks"], chat_template_kwargs=case["chat_template_kwargs"],
                        history_tool_calls=case["history_tool_calls"], vocab=vocab, prompt_tail=family.prompt_tail,
                        trace=trace, stream=case["mode"] == "st")


# The explorer's model whose real tokenizer each corpus family's outputs come from (Kimi's is not offline; GPT-OSS
# jobs carry real harmony ids).
FAMILY_MODELS = {"qwen3": "qwen3.6", "glm": "glm-5.1", "deepseek_v4": "deepseek-v4"}


@functools.cache
def _model_vocab(family: str) -> AddedVocab:
    """The family's real tokenizer's added tokens (older releases look up tokens the corpus's short list lacks, e.g.
    GLM's <|assistant|>); the corpus's own tokens and flags win where both name one. Its tokenizer.json also serves
    SGLang 0.5.23, which sends DeepSeek V4 output through deepseek-recipe and tokenizes with it."""
    from engine.models import load_model

    if family not in FAMILY_MODELS:
        return AddedVocab({}, frozenset())
    return AddedVocab.from_tokenizer(load_model(FAMILY_MODELS[family]).tokenizer) or AddedVocab({}, frozenset())


def parse_as_served(spec: str, family: str, text: str, *, reasoning_parser: str | None, tool_parser: str | None,
                    tools: list[dict] | None, stream: bool, chunks: list[str] | None = None,
                    chat_template_kwargs: dict | None = None, history_tool_calls: int = 0):
    """What a client of `spec` gets for `text` (a model of corpus `family`): the pinned release's emulation where it
    has the pair, else the release's own code driven as the golden files are written (run_case), random ids
    normalised as those files record them. A test that calls it for real code must require_release(spec) first."""
    engine = for_parsers(get_engine(spec), reasoning_parser, tool_parser)
    if not engine.is_real_release:
        return engine.parse(text, reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools,
                            stream=stream, chunks=chunks, chat_template_kwargs=chat_template_kwargs,
                            history_tool_calls=history_tool_calls)
    result = run_case(engine, {"family": family, "text": text, "reasoning_parser": reasoning_parser,
                               "tool_parser": tool_parser, "tools": tools, "chunks": chunks,
                               "chat_template_kwargs": chat_template_kwargs,
                               "history_tool_calls": history_tool_calls, "mode": "st" if stream else "ns"})
    calls = tuple(ToolCall(_RANDOM_ID.sub(r"\1<uuid>", c.id) if c.id is not None else None, c.name, c.arguments)
                  for c in result.tool_calls)
    return dataclasses.replace(result, tool_calls=calls)
