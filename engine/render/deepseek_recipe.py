"""DeepSeek V4 as SGLang 0.5.23 renders it: through that release's own request path and DeepSeek's deepseek-recipe.

SGLang 0.5.23 serving a DeepSeek V4 checkpoint (or launched with `--tool-call-parser deepseekv4`) resolves the
`dsv4` chat encoding (chat_encoding.py:33-34) and builds the prompt with `DeepSeekRecipeChatEncodingAdapter`
(serving_deepseek_recipe.py `encode_messages`): the request as sent on the wire (not the messages SGLang normalised),
`pre_normalize` (deepseek_recipe_renderer.py: developer -> system, object arguments dumped compactly, tools dropped
with tool_choice none), then deepseek-recipe 0.2.0's own conversion and encoder. Nothing of that is re-implemented
here: the release's `_process_messages` runs in its sandboxed worker (engine/serving/real), with the model's real
tokenizer, and returns the prompt ids, decoded here to text. A request the server would answer with 400 (a
conversion recipe refuses) is a RenderError with the server's sentence.

kwargs understood are the request's chat_template_kwargs as SGLang reads them: `thinking` (bool; off unless given,
SGLANG_DEFAULT_THINKING), `reasoning_effort` for the effort line. `add_generation_prompt` has no effect: the recipe
appends `<｜Assistant｜>` and the think token itself.

Provenance is by the messages' own text: each message's content, reasoning and call arguments are found in the
prompt in order, and those characters belong to that message; everything else is the encoder's scaffolding (-1).
No encoder lines are known (deepseek-recipe is compiled), so every character's line is the release's call into the
recipe (serving_deepseek_recipe.py `ENCODE_LINE`), whose source the cell shows.

The renderer table (engine/serving/rendering.py `RULES`) renders DeepSeek V4 on sglang@0.5.23 with it, the first
SGLang release that imports deepseek-recipe (0.5.12-0.5.22 render V4 through their bundled encoding_dsv4.py). Cause
attribution cannot undo the recipe's constructs (there is no source to instrument): a cell's cause there is the
first differing character and the message it belongs to.
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import RenderError
from engine.types import Rendered

MODEL_ID = "deepseek-v4"
ENGINE, VERSION = "sglang", "0.5.23"  # the release it renders as when none is given
PARSERS = ("deepseek-v4", "deepseekv4")  # the parser pair that selects the recipe's output path too
RENDER_TIMEOUT_S = 30.0
ENCODE_LINE = 144  # serving_deepseek_recipe.py at 0.5.23: `prompt_ids = self._encode(body, effort=…)`, into the recipe
# Why cause attribution cannot undo a construct here (engine/blame.py reads it).
OPAQUE = ("deepseek-recipe is a compiled extension (deepseek_recipe/_native.abi3.so): none of its constructs can be "
          "undone to test which one moved the break")


class SglangDeepSeekRecipeRenderer:
    """`tokenizer`: DeepSeek V4's real tokenizer (the recipe tokenizes with its tokenizer.json)."""

    def __init__(self, tokenizer: Any, engine: str = ENGINE, version: str = VERSION, where: str = "") -> None:
        self.tokenizer = tokenizer
        self.engine, self.version = engine, version
        # "sglang 0.5.23 …", as the engines' own encoders are named: a cause's link goes to that release's source
        self.origin = f"{self.engine} {self.version} deepseek-recipe (real code)"
        self.source_path = "sglang/srt/entrypoints/openai/serving_deepseek_recipe.py"
        self.request_side = f"{self.engine} {self.version} real code ({where or self.source_path})"
        self.opaque = OPAQUE
        self._lines: list[str] | None = None

    def source_lines(self) -> list[str]:
        """The release's serving_deepseek_recipe.py (the recipe's own encoder is compiled: no lines to show)."""
        if self._lines is None:
            from engine.serving.real import fetch

            try:
                root = fetch.fetch_sources(self.engine, self.version).root
                self._lines = (root / self.source_path).read_text(encoding="utf-8").splitlines()
            except (fetch.FetchError, OSError):
                self._lines = []
        return list(self._lines)

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool = True,
               kwargs: dict | None = None) -> Rendered:
        text, _ = self.prompt(messages, tools, kwargs)
        return Rendered(text, provenance=lambda: message_provenance(text, messages), source_path=self.source_path,
                        origin=self.origin)

    def prompt(self, messages: list[dict], tools: list[dict] | None, kwargs: dict | None = None
               ) -> tuple[str, tuple[int, ...]]:
        """The prompt text and the prompt ids the release's request path builds (the server's 400 a RenderError)."""
        from engine.serving.real.backend import AddedVocab, EngineWorkerError, ask_release

        vocab = AddedVocab.from_tokenizer(self.tokenizer)
        if vocab is None or vocab.tokenizer_json is None:
            raise RenderError(f"{MODEL_ID}: {self.origin} needs the model's tokenizer.json, which is not loaded",
                              model=MODEL_ID, path=self.source_path)
        job = {"op": "render", "messages": messages, "tools": tools or None, "chat_template_kwargs": kwargs or None,
               "reasoning_parser": PARSERS[0], "tool_parser": PARSERS[1], "force_reasoning": True,
               "tokenizer": vocab.reference()}
        try:
            reply = ask_release(self.engine, self.version, job, RENDER_TIMEOUT_S, vocab=vocab)
        except EngineWorkerError as err:
            raise RenderError(f"{MODEL_ID}: {self.origin} could not run here: {err}", model=MODEL_ID,
                              path=self.source_path) from err
        result = reply.get("result") or {}
        error = result.get("error") or (None if reply.get("ok") else reply.get("error"))
        if error:
            raise RenderError(f"{MODEL_ID}: {self.engine} {self.version} refuses the request: {error}",
                              model=MODEL_ID, path=self.source_path)
        return result["text"], tuple(result["ids"])


def message_texts(message: dict) -> list[str]:
    """The message's own strings in the order the encoder writes them: reasoning, content, then each call's name and
    argument values."""
    texts = [message.get("reasoning_content") or message.get("reasoning") or ""]
    content = message.get("content")
    if isinstance(content, list):
        texts += [part.get("text", "") for part in content if isinstance(part, dict)]
    elif isinstance(content, str):
        texts.append(content)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        texts.append(str(function.get("name") or ""))
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):  # DSML writes each value as its own parameter
            texts += [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in parsed.values()]
        elif isinstance(arguments, str):
            texts.append(arguments)
    return [t for t in texts if t]


def message_provenance(text: str, messages: list[dict]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each character's message index (found in order; -1 scaffolding) and source line (the call into the recipe)."""
    index = [-1] * len(text)
    position = 0
    for number, message in enumerate(messages):
        for piece in message_texts(message):
            start = text.find(piece, position)
            if start == -1:
                continue  # the encoder dropped or rewrote it (e.g. earlier turns' reasoning)
            index[start:start + len(piece)] = [number] * len(piece)
            position = start + len(piece)
    return tuple(index), (ENCODE_LINE,) * len(text)
