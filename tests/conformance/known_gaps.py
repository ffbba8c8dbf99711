"""Cases where the project's emulation knowingly differs from the real engine, with the reason.

Keyed by engine@version and case id (a trailing "*" matches a prefix). generate.py copies the reason into the golden
file; tests/test_parsers_golden.py turns it into a strict xfail naming the reason.
"""

from __future__ import annotations

_NOT_YET = "family not emulated yet: the parser name is registered but raises NotImplementedError"
_PENDING_FAMILIES = {f"{family}/*": _NOT_YET for family in ()}

KNOWN_GAPS: dict[str, dict[str, str]] = {
    "vllm@0.33.0": dict(_PENDING_FAMILIES),
    "sglang@0.5.23": dict(_PENDING_FAMILIES),
    "sglang@0.5.12": dict(_PENDING_FAMILIES),
}


def reason(spec: str, case_id: str) -> str | None:
    for pattern, why in KNOWN_GAPS.get(spec, {}).items():
        if case_id == pattern or (pattern.endswith("*") and case_id.startswith(pattern[:-1])):
            return why
    return None
