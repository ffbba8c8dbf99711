"""Conversation shapes used by the render parity and provenance tests (OpenAI-style messages)."""

from __future__ import annotations

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}
TOOLS = [WEATHER_TOOL]


def _call(city: str, call_id: str = "call_0", as_string: bool = False) -> dict:
    args = f'{{"city": "{city}"}}' if as_string else {"city": city}
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}


CONVERSATIONS: dict[str, tuple[list[dict], list[dict] | None]] = {
    "single-user": ([{"role": "user", "content": "Hello there"}], None),
    "system-user": ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], None),
    "tool-round": ([
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "I should call the tool.", "content": "",
         "tool_calls": [_call("Paris")]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21C"},
    ], TOOLS),
    "full-round-next-user": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Call the tool.", "content": "", "tool_calls": [_call("Paris")]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "assistant", "reasoning_content": "Answer now.", "content": "It is sunny in Paris."},
        {"role": "user", "content": "And in 東京?"},
    ], TOOLS),
    "parallel-calls-string-args": ([
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "reasoning_content": "Two calls.", "content": "Checking both.",
         "tool_calls": [_call("Paris", "call_0", True), _call("Rome", "call_1", True)]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ], TOOLS),
    "no-tools-reasoning": ([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "\nSimple.\n", "content": "4"},
        {"role": "user", "content": "times 3?"},
    ], None),
}
