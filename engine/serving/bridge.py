"""The bridge column: an append-only next prompt (the previous prompt and completion kept byte for byte, the new
messages rendered after them), and the sampled completion's token ids it extends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import RenderError
from engine.formats import Completion
from engine.models import LoadedModel
from engine.tokenize import token_ids
from engine.types import Provenance, Rendered


def sampled_completion_ids(model: LoadedModel, completion: Completion, noncanonical: bool) -> tuple[int, ...] | None:
    """The completion's token ids as the model sampled them (None without a tokenizer); `noncanonical`: a sampled
    tokenization that is not what re-tokenizing the text gives back."""
    if model.tokenizer is None:
        return None
    whole = token_ids(model.tokenizer, completion.text)
    if not noncanonical:
        return whole
    # A sampled tokenization that decodes to the same text but is not what re-tokenization gives back:
    # split one word of at least four letters in two.
    text = completion.text
    for start in range(len(text)):
        if text[start:start + 4].isalpha() and (start == 0 or not text[start - 1].isalpha()):
            cut = start + 2
            ids = token_ids(model.tokenizer, text[:cut]) + token_ids(model.tokenizer, text[cut:])
            if ids != whole and model.tokenizer.decode(ids) == text:
                return ids
    return whole


# The minimal history the bridge renders the new messages after: a one-line user turn and an assistant turn with the
# real turn's tool calls (names and ids only; templates name a tool result after the call it answers), so no message
# the model or the user wrote is ever rendered again.
SYNTHETIC_USER = {"role": "user", "content": "Go on."}


def synthetic_history(assistant: dict) -> list[dict]:
    message: dict[str, Any] = {"role": "assistant", "content": "" if assistant.get("tool_calls") else "OK."}
    calls = [{"id": call.get("id"), "type": "function",
              "function": {"name": (call.get("function") or {}).get("name"), "arguments": "{}"}}
             for call in assistant.get("tool_calls") or []]
    if calls:
        message["tool_calls"] = calls
    return [dict(SYNTHETIC_USER), message]


def turn_closes(model: LoadedModel, completion: Completion) -> tuple[str, ...]:
    """The strings that end an assistant turn: the model's stop tokens and the template's turn end, longest first."""
    closes = {*model.spec.stop_tokens, model.spec.special_tokens.get("turn_end") or "", completion.stop_token or ""}
    return tuple(sorted((c for c in closes if c), key=len, reverse=True))


def bridge_prompt(model: LoadedModel, prompt: Rendered, completion: Completion, assistant: dict,
                   new_messages: list[dict], assistant_index: int,
                   render: Callable[[list[dict]], Rendered]) -> Rendered:
    """Append-only next prompt: the previous prompt and completion byte for byte, the turn close synthesised after a
    truncation, then what the template renders after an assistant turn's close for the new messages alone.

    The new messages are rendered after a synthetic closed history (`synthetic_history`) and the text after that
    history's turn close is taken, as rllm's generic chat-template parser takes a generation prompt as a suffix: the
    history itself is never rendered again, so the bridge holds wherever the new messages render. What follows the
    close before the next message (Qwen's newline after <|im_end|>, which the engine does not return) comes with it,
    as the template renders it."""
    roles = [m.get("role") for m in new_messages]
    if "assistant" in roles or not new_messages:
        raise RenderError("the bridge appends only user and tool messages; re-rendering an assistant message would "
                          "replace what the model sampled (new messages: " + ", ".join(map(str, roles)) + ")")
    synthetic = synthetic_history(assistant)
    extended = render(synthetic + new_messages)
    text, idx = extended.text, extended.message_index
    first_new = len(synthetic)
    # C-speed tuple.index per distinct message instead of a Python loop over every character.
    assistant_at = idx.index(first_new - 1) if first_new - 1 in idx else None
    new_at = min((idx.index(m) for m in set(idx) if m >= first_new), default=len(text))
    # The synthetic turn's close: the last close that starts within it, up to where the new messages start (GLM's
    # close is the next message's own opener, <|observation|> or <|user|>).
    close_at, close = -1, ""
    for candidate in turn_closes(model, completion):
        at = text.rfind(candidate, assistant_at or 0, new_at + len(candidate))
        if at > close_at and at <= new_at:
            close_at, close = at, candidate
    if assistant_at is None or close_at < 0:
        raise RenderError(f"{extended.source_path or extended.origin} for model {model.id}: the bridge found no turn "
                          f"close ({', '.join(turn_closes(model, completion))}) after the assistant turn it renders "
                          "the new messages after")
    # After a truncation the close is synthesised as the template writes it; otherwise the model sampled it.
    kept_from = close_at if completion.truncated else close_at + len(close)

    def appended_index(m: int) -> int:
        if m >= first_new:
            return assistant_index + 1 + m - first_new
        return m if m < 0 else assistant_index  # the close and what follows it belong to the assistant turn

    def provenance() -> Provenance:
        # The previous prompt's provenance is read only when somebody reads this prompt's.
        return (prompt.message_index + (assistant_index,) * len(completion.text)
                + tuple(appended_index(m) for m in idx[kept_from:]),
                prompt.source_line + (0,) * len(completion.text) + extended.source_line[kept_from:])

    return Rendered(
        text=prompt.text + completion.text + text[kept_from:],
        source_path=extended.source_path,
        origin=f"bridge over {extended.origin}",
        provenance=provenance,
    )


def bridge_ids(model: LoadedModel, prev_ids: tuple[int, ...] | None, appended: str) -> tuple[int, ...] | None:
    if prev_ids is None or model.tokenizer is None:
        return None
    return prev_ids + token_ids(model.tokenizer, appended)
