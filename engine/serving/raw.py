"""The raw column's request: the client's messages as sent, arguments in the form the model's template expects."""

from __future__ import annotations

import json


def raw_request(messages: list[dict], arguments_in_history: str) -> list[dict]:
    """The raw engine hands arguments over losslessly in the form the model's own template expects."""
    if arguments_in_history != "mapping":
        return messages
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                args = c["function"]["arguments"]
                if isinstance(args, str):
                    try:
                        loaded = json.loads(args)
                        args = loaded if isinstance(loaded, dict) else args
                    except json.JSONDecodeError:
                        pass
                calls.append({**c, "function": {**c["function"], "arguments": args}})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out
