"""The `renderers` column: PrimeIntellect's `renderers` package (PyPI, pinned in requirements.txt) driven as prime-rl
drives it, offline, over our real tokenizer files.

prime-rl builds one renderer per model with `create_renderer(load_tokenizer(model), AutoRendererConfig(),
chat_template_kwargs=...)` and samples through verifiers' `TrainClient` (verifiers/v1/clients/train.py): the first
prompt is `renderer.render(messages, tools=..., add_generation_prompt=True)`; the completion ids come back from the
engine and are parsed client-side with `renderer.parse_response(completion_ids, tools=..., prompt_ids=...)` into the
assistant message; when the next messages are a clean `[tool*, user?]` tail, `renderer.bridge_to_next_turn(
previous_prompt_ids, previous_completion_ids, new_messages, tools=...)` extends the previous ids, and when it returns
None (or the tail is not clean) the whole history is rendered again. This module does the same calls with the same
arguments; the tokenizer object is an adapter over the model's tokenizer here (engine.models.load_model), since
`load_tokenizer` would download it from the Hub.

`renderers` auto-resolves only the exact Hub names in its `MODEL_RENDERER_MAP`; any other model is `unavailable`
here (its fallback, DefaultRenderer, wraps `apply_chat_template` and would probe the Hub first). The package's
renderers are hand-written ports of the chat templates, so every full render is compared with the model's real
template on the same messages, and the cell says where they differ.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any

from engine.client import scripted_message
from engine.errors import ExplorerError, RenderError
from engine.formats import Completion, get_format
from engine.models import LoadedModel
from engine.prefix import common_prefix
from engine.render.cache import render_kept
from engine.scenario import Scenario
from engine.serving.bridge import bridge_prompt, sampled_completion_ids
from engine.serving.raw import raw_request
from engine.tokenize import Tokenizer, token_ids
from engine.types import Boundary, ParseResult, PrefixCheck, Rendered, RenderRequest, ToolCall

NAME = "renderers"


class Unavailable(ExplorerError):
    """The package cannot serve this model here (not in its map, no tokenizer, not installed)."""


class Failed(ExplorerError):
    """The package refused a request (a render or a parse raised)."""

    def __init__(self, message: str, boundaries: tuple[Boundary, ...]) -> None:
        super().__init__(message)
        self.boundaries = boundaries


@functools.cache
def version() -> str:
    try:
        return metadata.version("renderers")
    except metadata.PackageNotFoundError:
        return ""


class TokenizerAdapter:
    """The model's tokenizer behind the surface `renderers.base.Tokenizer` declares (`name_or_path`, `encode`,
    `decode`, `convert_tokens_to_ids`, `eos_token_id`, `unk_token_id`). `encode` tokenizes the whole string with
    special tokens as single ids, as a Hugging Face tokenizer does with add_special_tokens=False; no character
    offsets are offered (optional in `renderers`: only its `is_content` masks need them)."""

    def __init__(self, tokenizer: Tokenizer, name_or_path: str, eos_token: str | None) -> None:
        self._tokenizer = tokenizer
        self.name_or_path = name_or_path
        self.unk_token_id: int | None = None
        self.eos_token_id = tokenizer.token_id(eos_token) if eos_token else None

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        return list(token_ids(self._tokenizer, text))

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> str:
        return self._tokenizer.decode([ids] if isinstance(ids, int) else list(ids))

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if not isinstance(tokens, str):
            return [self._one_id(token) for token in tokens]
        return self._one_id(tokens)

    def _one_id(self, token: str) -> int | None:
        special = self._tokenizer.token_id(token)
        if special is not None:
            return special
        ids = token_ids(self._tokenizer, token)
        return ids[0] if len(ids) == 1 else self.unk_token_id


@dataclass
class _Served:
    renderer: Any
    lock: threading.Lock  # the web app renders from several threads; one renderer serves one call at a time
    dropped_kwargs: tuple[str, ...]  # template kwargs of the cell the renderer's config does not accept

    @property
    def label(self) -> str:
        return f"renderers {version()} {type(self.renderer).__name__}"


def unavailable_reason(model: LoadedModel) -> str | None:
    """One sentence when the package cannot serve this model here, else None."""
    try:
        from renderers.base import MODEL_RENDERER_MAP
    except ImportError as err:
        return f"the renderers package is not installed here ({err}); pip install -r requirements.txt"
    repo = model.spec.hub_repo
    if repo not in MODEL_RENDERER_MAP:
        return (f"renderers {version()} has no renderer for {repo} (its MODEL_RENDERER_MAP names models exactly), so "
                f"prime-rl's auto config would fall back to DefaultRenderer, which renders through the Hub "
                f"tokenizer's Jinja chat template" + (" and DeepSeek V4 ships none" if model.spec.renderer ==
                                                       "deepseek_v4" else ""))
    if model.tokenizer is None:
        return (f"renderers needs a tokenizer object, and {model.spec.assets['tokenizer'].hub_file} of {repo} is not "
                f"shipped by any package here (put it in $DRIFT_ASSETS_DIR/{model.id}/ or upload it)")
    return None


@lru_cache(maxsize=64)
def _served(tokenizer: Tokenizer, hub_repo: str, family: str, eos_token: str | None, kwargs_json: str) -> _Served:
    """One renderer per tokenizer, model and kwargs, as prime-rl builds one per run (built once: GPT-OSS's loads the
    harmony encoding)."""
    from renderers import AutoRendererConfig, create_renderer, template_field_names
    from renderers.base import MODEL_RENDERER_MAP
    from renderers.configs import config_from_name

    if family == "harmony":  # its GptOssRenderer loads the harmony encoding, whose vocabulary we rebuild offline
        from engine.render.harmony_encoding import o200k_base_path

        o200k_base_path()
    kwargs = json.loads(kwargs_json)
    accepted = template_field_names(config_from_name(MODEL_RENDERER_MAP[hub_repo]))
    passed = {k: v for k, v in kwargs.items() if k in accepted}
    renderer = create_renderer(TokenizerAdapter(tokenizer, hub_repo, eos_token), AutoRendererConfig(),
                               chat_template_kwargs=passed or None)
    return _Served(renderer, threading.Lock(), tuple(sorted(k for k in kwargs if k not in accepted)))


def _is_clean_tail(messages: list[dict]) -> bool:
    """verifiers' `_is_valid_incremental_tail`: tool messages, optionally ending in one user message."""
    roles = [m.get("role") for m in messages]
    if not roles:
        return False
    body = roles[:-1] if roles[-1] == "user" else roles
    return all(role == "tool" for role in body)


def _client_message(parsed: Any, send_reasoning: bool) -> tuple[dict, list[str]]:
    """The assistant message verifiers keeps (`response_from_generate`, then `message_to_wire`): content or None
    (an empty string without tool calls), the reasoning, calls with a name and a known tool, ids `call_<i>` when the
    format carries none, arguments as a JSON string."""
    from renderers.base import ToolCallParseStatus

    calls = [
        {"id": c.id or f"call_{i}", "type": "function",
         "function": {"name": c.name,
                      "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments or {})}}
        for i, c in enumerate(parsed.tool_calls or [])
        if c.name and c.status != ToolCallParseStatus.UNKNOWN_TOOL
    ]
    content = parsed.content or None
    message: dict[str, Any] = {"role": "assistant", "content": "" if content is None and not calls else content}
    if parsed.reasoning_content is not None and send_reasoning:
        message["reasoning_content"] = parsed.reasoning_content
    if calls:
        message["tool_calls"] = calls
    return message, [c["id"] for c in calls]


def _parse_result(message: dict) -> ParseResult:
    return ParseResult(
        reasoning=message.get("reasoning_content"), content=message.get("content"),
        tool_calls=tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                         for c in message.get("tool_calls") or []))


def _rendered(model: LoadedModel, ids: Sequence[int], token_messages: Sequence[int], origin: str) -> Rendered:
    """Text of the ids with each character's message (from the renderer's per-token attribution); the package's
    code is Python, not template lines, so source lines are unknown (0)."""
    assert model.tokenizer is not None
    tokenizer = model.tokenizer
    text = tokenizer.decode(list(ids))

    def provenance() -> tuple[tuple[int, ...], tuple[int, ...]]:
        pieces = [tokenizer.token_text(i) for i in ids]
        if "".join(pieces) == text:
            lengths = [len(p) for p in pieces]
        else:  # a character split over tokens: lengths from decoded prefixes
            ends = [len(tokenizer.decode(list(ids[:k + 1]))) for k in range(len(ids))]
            lengths = [end - start for start, end in zip([0, *ends], ends)]
        index = tuple(m for m, n in zip(token_messages, lengths) for _ in range(n))
        index = (index + (-1,) * len(text))[:len(text)]
        return index, (0,) * len(text)

    return Rendered(text=text, source_path=f"renderers/{origin.split()[-1]}", origin=origin, provenance=provenance)


def _template_difference(model: LoadedModel, messages: list[dict], tools: list[dict] | None, kwargs: dict,
                         ids: Sequence[int], request: int) -> str | None:
    """Where the package's full render of request `request` differs from the model's real template, or None."""
    assert model.tokenizer is not None
    template = model.renderer.inner if hasattr(model.renderer, "inner") else model.renderer
    name = getattr(template, "source_path", "") or model.spec.renderer
    try:
        real = render_kept(model.renderer, raw_request(messages, get_format(model.spec.family).arguments_in_history),
                           tools, add_generation_prompt=True, kwargs=kwargs)
    except RenderError as err:
        return f"request {request}: the model's template cannot render these messages ({err})"
    differs = _first_difference(model.tokenizer, ids, token_ids(model.tokenizer, real.text))
    return f"request {request}: its render differs from the model's template ({name}) at {differs}" if differs else None


def _first_difference(tokenizer: Tokenizer, ids: Sequence[int], template_ids: Sequence[int]) -> str | None:
    """'token N of M: <theirs> where the template has <the template's>', or None when the ids are equal."""
    if tuple(ids) == tuple(template_ids):
        return None
    at = common_prefix(tuple(ids), tuple(template_ids))

    def token(seq: Sequence[int]) -> str:
        return repr(tokenizer.token_text(seq[at])) if at < len(seq) else "the end"

    return f"token {at} of {len(template_ids)}: {token(ids)} where the template has {token(template_ids)}"


def _bridge_difference(model: LoadedModel, boundary_parts: tuple, new_messages: list[dict], assistant: dict,
                       assistant_index: int, tools: list[dict] | None, kwargs: dict, bridged_ids: Sequence[int],
                       request: int) -> str | None:
    """Where the package's bridged ids differ from what the model's template writes after the turn for the same new
    messages (engine.simulate's append-only bridge over the same previous ids), or None."""
    assert model.tokenizer is not None
    prompt, prompt_ids, completion, completion_ids = boundary_parts
    arguments = get_format(model.spec.family).arguments_in_history
    try:
        ours = bridge_prompt(model, prompt, completion, assistant, new_messages, assistant_index,
                             lambda messages: render_kept(model.renderer, raw_request(messages, arguments), tools,
                                                          add_generation_prompt=True, kwargs=kwargs))
    except RenderError as err:
        return f"request {request}: the model's template cannot render the new messages ({err})"
    kept = len(prompt.text) + len(completion.text)
    template_ids = tuple(prompt_ids) + tuple(completion_ids) + token_ids(model.tokenizer, ours.text[kept:])
    differs = _first_difference(model.tokenizer, bridged_ids, template_ids)
    return (f"request {request}: its bridge differs from what the model's template writes for the new messages at "
            f"{differs}") if differs else None


def _prefilled(tokenizer: Tokenizer, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> int:
    """How many leading completion tokens the prompt already ends with, when they start at a special token."""
    if not completion_ids or not tokenizer.is_special(completion_ids[0]):
        return 0
    longest = min(len(prompt_ids), len(completion_ids) - 1)
    return next((k for k in range(longest, 0, -1) if tuple(prompt_ids[-k:]) == tuple(completion_ids[:k])), 0)


def roundtrip(model: LoadedModel, scenario: Scenario, kwargs: dict[str, Any],
              stop_after: int | None = None) -> tuple[tuple[Boundary, ...], str]:
    """The cell's boundaries and its note: which renderer, how each next prompt was built (bridged or rendered),
    and where a full render differs from the model's template."""
    reason = unavailable_reason(model)
    if reason:
        raise Unavailable(reason)
    assert model.tokenizer is not None
    served = _served(model.tokenizer, model.spec.hub_repo, model.spec.family,
                     model.spec.special_tokens.get("eos_token"), json.dumps(kwargs, sort_keys=True))
    renderer, label = served.renderer, served.label
    fmt = get_format(model.spec.family)
    stop = model.spec.stop_tokens[0] if model.spec.stop_tokens else ""
    tools = list(scenario.tools or []) or None
    send_reasoning = scenario.client.get("send_reasoning", True)
    notes: list[str] = []
    if served.dropped_kwargs:
        notes.append(f"its config takes no {', '.join(served.dropped_kwargs)} (left out)")

    messages: list[dict] = [{"role": "system", "content": scenario.system}] if scenario.system else []
    boundaries: list[Boundary] = []
    # (prompt, prompt ids, per-token message of the prompt, completion, completion ids, parse, assistant index)
    pending: tuple | None = None
    call_ids: list[str] = []
    call_cursor = 0
    how: list[str] = []
    next_ids: list[int] = []
    next_messages: list[int] = []  # the renderer's per-token message attribution of the latest next prompt

    def full_render(request: int) -> tuple[list[int], list[int]]:
        try:
            with served.lock:
                rendered = renderer.render(messages, tools=tools, add_generation_prompt=True)
        except Exception as err:  # the package's own refusals are plain exceptions (ValueError, KeyError, ...)
            raise Failed(f"{label} cannot render request {request}: {type(err).__name__}: {err}",
                         tuple(boundaries)) from err
        difference = _template_difference(model, messages, tools, kwargs, rendered.token_ids, request)
        if difference:
            notes.append(difference)
        return list(rendered.token_ids), list(rendered.message_indices)

    for turn in scenario.turns:
        if turn.role in ("user", "tool"):
            messages.append(scripted_message(turn, call_ids, call_cursor))
            call_cursor += turn.role == "tool"
            if pending is None:
                continue
            prompt, prompt_ids, prompt_messages, completion, completion_ids, parsed, assistant_index = pending
            index = len(boundaries) + 1
            new_messages = messages[assistant_index + 1:]
            bridged = None
            if _is_clean_tail(new_messages):
                with served.lock:
                    bridged = renderer.bridge_to_next_turn(list(prompt_ids), list(completion_ids), new_messages,
                                                           tools=tools)
            if bridged is not None:
                next_ids = list(bridged.token_ids)
                kept = len(prompt_ids) + len(completion_ids)
                next_messages = (list(prompt_messages) + [assistant_index] * len(completion_ids)
                                 + [assistant_index if m < 0 else assistant_index + 1 + m
                                    for m in bridged.message_indices[kept:]])[:len(next_ids)]
                how.append(f"request {index + 1} bridged (bridge_to_next_turn)")
                difference = _bridge_difference(model, (prompt, prompt_ids, completion, completion_ids),
                                                new_messages, messages[assistant_index], assistant_index, tools,
                                                kwargs, next_ids, index + 1)
                if difference:
                    notes.append(difference)
            else:
                why = "bridge_to_next_turn returned None" if _is_clean_tail(new_messages) else (
                    "the new messages are not a [tool*, user?] tail, so verifiers does not bridge")
                retention = getattr(renderer, "effective_thinking_retention", None)
                if retention == "tool_cycle" and any(m.get("role") == "user" for m in new_messages):
                    why += "; its thinking_retention is 'tool_cycle' and a user turn is new"
                next_ids, next_messages = full_render(index + 1)
                how.append(f"request {index + 1} fell back to a full render ({why})")
            next_prompt = _rendered(model, next_ids, next_messages, label)
            prev_text = prompt.text + completion.text
            prev_ids = tuple(prompt_ids) + tuple(completion_ids)
            boundaries.append(Boundary(
                index, turn.role, prompt, completion, tuple(completion_ids), tuple(prompt_ids), parsed, (),
                next_prompt, tuple(next_ids), PrefixCheck(len(prev_text), common_prefix(prev_text, next_prompt.text)),
                PrefixCheck(len(prev_ids), common_prefix(prev_ids, tuple(next_ids))),
                RenderRequest(list(messages), tools, True, kwargs)))
            pending = None
            if stop_after is not None and len(boundaries) >= stop_after:
                break
            continue
        assert turn.assistant is not None
        if boundaries:  # the prompt sent is the previous boundary's next prompt, bridged or rendered
            prompt, prompt_ids, prompt_messages = boundaries[-1].next_prompt, next_ids, next_messages
        else:
            prompt_ids, prompt_messages = full_render(1)
            prompt = _rendered(model, prompt_ids, prompt_messages, label)
        completion: Completion = fmt.write(turn.assistant, stop)
        completion_ids = sampled_completion_ids(model, completion, turn.noncanonical_tokens) or ()
        prefilled = _prefilled(model.tokenizer, prompt_ids, completion_ids)
        if prefilled:
            # The generation prompt already holds how the model's turn starts (GPT-OSS: renderers' prompt ends with
            # <|channel|>analysis<|message|>), so the model samples only the rest.
            opener = model.tokenizer.decode(list(completion_ids[:prefilled]))
            completion = Completion(completion.text[len(opener):], completion.stop_token, completion.truncated)
            completion_ids = completion_ids[prefilled:]
        try:
            with served.lock:
                response = renderer.parse_response(list(completion_ids), tools=tools, prompt_ids=list(prompt_ids))
        except Exception as err:
            raise Failed(f"{label} cannot parse the completion of request {len(boundaries) + 1}: "
                         f"{type(err).__name__}: {err}", tuple(boundaries)) from err
        client, call_ids = _client_message(response, send_reasoning)
        call_cursor = 0
        messages.append(client)
        pending = (prompt, prompt_ids, prompt_messages, completion, completion_ids, _parse_result(client),
                   len(messages) - 1)
    note = "; ".join([f"{label} as verifiers' TrainClient calls it", *how, *notes])
    return tuple(boundaries), note
