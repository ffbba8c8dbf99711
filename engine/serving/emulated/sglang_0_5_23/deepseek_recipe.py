"""SGLang 0.5.23 with `--tool-call-parser deepseekv4`: not emulated; the release's own serving code runs it.

That server does not run the DSML parser classes for DeepSeek V4: `resolve_chat_encoding_spec` maps the parser
name to the `dsv4` chat encoding (chat_encoding.py:33-34), whose adapter (chat_encoding_adapters.py:293-294,
serving_deepseek_recipe.py) renders the prompt and parses the output token by token through DeepSeek's
`deepseek-recipe` package (0.2.0, installed from requirements.txt): reasoning and answer come back trimmed, a
string parameter's surrounding newlines are kept, a call to an undeclared tool is returned. Emulating that means
copying a compiled parser, so the emulation hands these parses to the real-engine backend (engine/serving/real):
sglang@0.5.23's sources in a sandboxed worker, with the model's real tokenizer (recipe tokenizes the output itself)
and the line tracer on, so the result's edits cite lines that release executed.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from engine.types import ParseResult

# SGLang's random call ids (serving_chat.py _process_tool_call_id: call_ + 24 hex digits), shown as the emulations
# show them, so a cell does not change between runs
_RANDOM_ID = re.compile(r"^call_[0-9a-f]{16,32}$")
SHOWN_ID = "call_<uuid>"

VERSION = "0.5.23"
TOOL_PARSER = "deepseekv4"  # chat_encoding.py:33-34: this name alone selects the dsv4 (deepseek-recipe) encoding
MODEL_ID = "deepseek-v4"


def owns(version: str, tool_parser: str | None) -> bool:
    """Whether SGLang `version` (an emulated one) parses through deepseek-recipe for this tool parser, whatever the
    reasoning parser (the adapter rejects mixing at startup, serving_deepseek_recipe.py:80-88); 0.5.12 predates it."""
    return version == VERSION and tool_parser == TOOL_PARSER


def parse(text: str, *, reasoning_parser: str | None, tool_parser: str | None, tools: list[dict] | None,
          stream: bool, chunks: list[str] | None, chat_template_kwargs: dict | None, history_tool_calls: int,
          tokenizer: Any) -> ParseResult:
    """What sglang@0.5.23's own serving code returns (its worker's error as the result's error, one sentence)."""
    from engine.serving.real.backend import RealEngine

    if tokenizer is None:  # the golden corpus and the CLI without a model: DeepSeek V4's own tokenizer
        from engine.models import load_model

        tokenizer = load_model(MODEL_ID).tokenizer
    result = RealEngine("sglang", VERSION).parse(
        text, reasoning_parser=reasoning_parser, tool_parser=tool_parser, tools=tools, stream=stream, chunks=chunks,
        chat_template_kwargs=chat_template_kwargs, history_tool_calls=history_tool_calls, tokenizer=tokenizer,
        trace=True)
    if result.error:
        return ParseResult(None, None, error=f"sglang@{VERSION}'s own code (DeepSeek V4 through deepseek-recipe) "
                                             f"failed: {result.error}")
    calls = tuple(dataclasses.replace(c, id=SHOWN_ID) if c.id and _RANDOM_ID.match(c.id) else c
                  for c in result.tool_calls)
    return dataclasses.replace(result, tool_calls=calls)
