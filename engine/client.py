"""What an OpenAI-style client sends back to the engine: the assistant message as the engine returned it, the call
ids it answers with, a scenario's user and tool turns, and the engine's request-side edit undone (for blame)."""

from __future__ import annotations

from typing import Any

from engine.call_ids import SessionCallIds
from engine.formats.base import OutputFormat
from engine.scenario import ScriptTurn
from engine.types import Edit, ParseResult


def client_message(parsed: ParseResult, call_ids: list[str], *, send_reasoning: bool = True) -> dict:
    """The assistant message an OpenAI-style client sends back: what the engine returned, fields as named
    (`send_reasoning=False`: without reasoning_content, as clients that only keep content and tool_calls do)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None and send_reasoning:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c, cid in zip(parsed.tool_calls, call_ids)
        ]
    return message


def client_call_ids(parsed: ParseResult, scripted: list[str | None], fmt: OutputFormat, session_ids: SessionCallIds,
                    calls_so_far: int) -> list[str]:
    """The ids a client sends back for the engine's calls: the engine's own (its random ones made stable and
    distinct, engine.call_ids), else the script's, else the client's numbering (`OutputFormat.client_call_id`)."""
    return [session_ids.client_id(c.id, calls_so_far + i) if c.id else
            scripted[i] if i < len(scripted) and scripted[i] else fmt.client_call_id(calls_so_far + i)
            for i, c in enumerate(parsed.tool_calls)]


def scripted_message(turn: ScriptTurn, call_ids: list[str], call_cursor: int) -> dict[str, Any]:
    """A scenario's user or tool turn as the client sends it; a tool result answers the `call_cursor`-th call of the
    latest assistant turn."""
    message: dict[str, Any] = {"role": turn.role, "content": turn.text}
    if turn.role == "tool":
        message["tool_call_id"] = call_ids[call_cursor] if call_cursor < len(call_ids) else "call_missing"
    return message


def undo_request_edit(prepared: list[dict], client_messages: list[dict], edit: Edit) -> list[dict]:
    """The engine's prepared messages with one request-side edit undone: the field it changed back as the client
    sent it (a call's arguments string; a message's reasoning fields)."""
    from engine.serving.base import json_copy

    restored = json_copy(prepared)
    for index, (message, original) in enumerate(zip(restored, client_messages)):
        if edit.before.startswith(f"messages[{index}]."):
            for key in ("reasoning", "reasoning_content"):
                message.pop(key, None)
                if key in original:
                    message[key] = original[key]
            continue
        for call, original_call in zip(message.get("tool_calls") or [], original.get("tool_calls") or []):
            arguments = original_call.get("function", {}).get("arguments")
            if arguments == edit.before:
                call["function"]["arguments"] = arguments
    return restored
