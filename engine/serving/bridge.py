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


CHOICE_NOTE = "its synthetic turn carries "  # in a bridged prompt's origin, when not the turn's calls


class BridgeUnavailable(RenderError):
    """The template renders the new messages after no closed turn the bridge can write (one sentence)."""


def synthetic_history(assistant: dict, calls: list[dict] | None = None) -> list[dict]:
    """The synthetic closed history: the user turn, then an assistant turn with `calls` (default: the real turn's
    calls, names and ids only)."""
    if calls is None:
        calls = list(assistant.get("tool_calls") or [])
    message: dict[str, Any] = {"role": "assistant", "content": "" if calls else "OK."}
    if calls:
        message["tool_calls"] = [{"id": call.get("id"), "type": "function",
                                  "function": {"name": (call.get("function") or {}).get("name"), "arguments": "{}"}}
                                 for call in calls]
    return [dict(SYNTHETIC_USER), message]


def synthetic_choices(assistant: dict, new_messages: list[dict]) -> list[tuple[str, list[list[dict]]]]:
    """The closed histories the bridge may render the new messages after, best first, each as (what it is, its
    histories): a choice serves when each of its histories renders and all give the new messages the same text.

    1. the turn with its calls;
    2. for a template that refuses the calls together (Llama 3.1 takes one call a turn): each call alone, a history
       each, so the new messages' text is shown not to depend on which call the turn carries;
    3. when no tool result follows (nothing names a call): the turn without calls (Mistral's template takes no user
       message right after calls)."""
    calls = list(assistant.get("tool_calls") or [])
    choices = [("the turn's calls", [synthetic_history(assistant)])]
    if len(calls) > 1:
        choices.append(("each call alone", [synthetic_history(assistant, [call]) for call in calls]))
    if calls and all(m.get("role") != "tool" for m in new_messages):
        choices.append(("no calls", [synthetic_history(assistant, [])]))
    return choices


def turn_closes(model: LoadedModel, completion: Completion) -> tuple[str, ...]:
    """The strings that end an assistant turn: the model's stop tokens and the template's turn end, longest first."""
    closes = {*model.spec.stop_tokens, model.spec.special_tokens.get("turn_end") or "", completion.stop_token or ""}
    return tuple(sorted((c for c in closes if c), key=len, reverse=True))


def _after_close(model: LoadedModel, completion: Completion, synthetic: list[dict], extended: Rendered) -> int:
    """Where the bridge takes its text from in `extended`, the render of `synthetic` + the new messages: after the
    synthetic turn's close (at it, after a truncation: the close is then written as the template writes it)."""
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
    return close_at if completion.truncated else close_at + len(close)


def bridge_prompt(model: LoadedModel, prompt: Rendered, completion: Completion, assistant: dict,
                   new_messages: list[dict], assistant_index: int,
                   render: Callable[[list[dict]], Rendered]) -> Rendered:
    """Append-only next prompt: the previous prompt and completion byte for byte, the turn close synthesised after a
    truncation, then what the template renders after an assistant turn's close for the new messages alone.

    The new messages are rendered after a synthetic closed history (`synthetic_choices`) and the text after that
    history's turn close is taken, as rllm's generic chat-template parser takes a generation prompt as a suffix: the
    history itself is never rendered again, so the bridge holds wherever the new messages render. What follows the
    close before the next message (Qwen's newline after <|im_end|>, which the engine does not return) comes with it,
    as the template renders it. `render` raises RenderError where the template refuses; BridgeUnavailable (a
    RenderError) says in one sentence that it refuses every choice."""
    roles = [m.get("role") for m in new_messages]
    if "assistant" in roles or not new_messages:
        raise RenderError("the bridge appends only user and tool messages; re-rendering an assistant message would "
                          "replace what the model sampled (new messages: " + ", ".join(map(str, roles)) + ")")
    refusals: list[RenderError] = []
    for what, histories in synthetic_choices(assistant, new_messages):
        try:  # only the template's refusal tries the next choice (a render without provenance is an error)
            extended_renders = [render(synthetic + new_messages) for synthetic in histories]
        except RenderError as err:
            refusals.append(err)
            continue
        renders = [(extended, _after_close(model, completion, synthetic, extended))
                   for synthetic, extended in zip(histories, extended_renders)]
        if len({extended.text[kept_from:] for extended, kept_from in renders}) == 1:
            extended, kept_from = renders[0]
            first_new = len(histories[0])
            # Said where the synthetic turn is not the turn's calls, and why.
            chosen = f"; {CHOICE_NOTE}{what}, the template refusing the turn's calls: {refusals[0]}" if refusals else ""
            break
        refusals.append(RenderError(f"with {what} the template renders the new messages differently"))
    else:
        raise BridgeUnavailable(_refusal(model, assistant, new_messages, refusals, render))
    idx = extended.message_index

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
        text=prompt.text + completion.text + extended.text[kept_from:],
        source_path=extended.source_path,
        origin=f"bridge over {extended.origin}{chosen}",
        provenance=provenance,
    )


def _refusal(model: LoadedModel, assistant: dict, new_messages: list[dict], refusals: list[RenderError],
             render: Callable[[list[dict]], Rendered]) -> str:
    """One sentence for a bridge the template refuses: the new messages themselves (rendered after a turn without
    calls, as a test only), else the turn they follow."""
    roles = ", ".join(str(m.get("role")) for m in new_messages)
    try:
        render(synthetic_history(assistant, []) + new_messages)
    except RenderError as err:
        return f"the bridge cannot append the new messages ({roles}): {err}"
    return f"the bridge cannot append the new messages ({roles}) after the turn they answer: {refusals[0]}"


def bridge_ids(model: LoadedModel, prev_ids: tuple[int, ...] | None, appended: str) -> tuple[int, ...] | None:
    if prev_ids is None or model.tokenizer is None:
        return None
    return prev_ids + token_ids(model.tokenizer, appended)
