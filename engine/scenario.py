"""Scenarios are data (`scenarios/*.yaml`): model-independent scripts of turns plus the output knobs they set."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from engine.errors import ExplorerError
from engine.formats.base import AssistantTurn, Knobs, ToolCallSpec

SCENARIOS_DIR = Path(__file__).resolve().parent.parent / "scenarios"


@dataclass(frozen=True)
class ScriptTurn:
    role: str  # user | tool | assistant
    text: str = ""
    assistant: AssistantTurn | None = None
    noncanonical_tokens: bool = False


@dataclass(frozen=True)
class Scenario:
    id: str
    description: str
    tools: list[dict] | None
    system: str | None
    turns: tuple[ScriptTurn, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the file it was read from, for evidence
    client: dict[str, Any] = field(default_factory=dict)  # how the client echoes turns, e.g. {send_reasoning: false}
    preamble: str | None = None  # the name in preambles.yaml whose text starts `system`

    @property
    def knob_summary(self) -> str:
        knobs = [t.assistant.knobs.describe() for t in self.turns if t.assistant]
        noncanonical = any(t.noncanonical_tokens for t in self.turns)
        parts = sorted({k for k in knobs if k != "canonical"})
        if noncanonical:
            parts.append("non-canonical completion tokens")
        return "; ".join(parts) or "canonical output"


@cache
def tool_library() -> dict[str, dict]:
    return yaml.safe_load((SCENARIOS_DIR / "tools.yaml").read_text(encoding="utf-8"))


@cache
def preamble_library() -> dict[str, str]:
    return yaml.safe_load((SCENARIOS_DIR / "preambles.yaml").read_text(encoding="utf-8"))


LIBRARY_FILES = ("tools", "preambles")  # scenarios/*.yaml that hold what scenarios refer to, not scenarios


def scenario_ids() -> list[str]:
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml") if p.stem not in LIBRARY_FILES)


@cache
def load_scenario(scenario_id: str) -> Scenario:
    path = SCENARIOS_DIR / f"{scenario_id}.yaml"
    if not path.is_file():
        raise ExplorerError(f"unknown scenario {scenario_id!r}; known: {', '.join(scenario_ids())}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return scenario_from_data(raw, str(path.relative_to(SCENARIOS_DIR.parent)))


CLIENT_SETTINGS = {"send_reasoning": True}  # what an OpenAI-style client does unless a scenario says otherwise


def _client_settings(raw: Any) -> dict[str, Any]:
    settings = dict(raw or {})
    unknown = sorted(set(settings) - set(CLIENT_SETTINGS))
    if unknown:
        raise ValueError(f"unknown client setting {unknown[0]!r} (known: {', '.join(CLIENT_SETTINGS)})")
    return settings


def scenario_from_data(raw: dict, source: str) -> Scenario:
    try:
        library = tool_library()
        tools = [library[name] for name in raw["tools"]] if raw.get("tools") else None
        turns = []
        for entry in raw["turns"]:
            (role, body), = entry.items()
            if role == "assistant":
                calls = tuple(
                    ToolCallSpec(name=c["name"], arguments=dict(c.get("arguments") or {}), call_id=c.get("id"))
                    for c in body.get("tool_calls") or ()
                )
                turn = AssistantTurn(reasoning=body.get("reasoning"), content=body.get("content") or "",
                                     tool_calls=calls, knobs=Knobs(**(body.get("knobs") or {})))
                turns.append(ScriptTurn("assistant", assistant=turn,
                                        noncanonical_tokens=body.get("completion_tokens") == "noncanonical"))
            elif role in ("user", "tool"):
                turns.append(ScriptTurn(role, text=str(body)))
            else:
                raise ValueError(f"unknown turn role {role!r}")
        preamble = raw.get("preamble")
        system = raw.get("system")
        if preamble is not None:
            library_text = preamble_library().get(preamble)
            if library_text is None:
                raise ValueError(f"unknown preamble {preamble!r} (known: {', '.join(preamble_library())})")
            system = library_text + (f"\n{system}" if system else "")
        return Scenario(id=raw["id"], description=raw.get("description", ""), tools=tools,
                        system=system, turns=tuple(turns), kwargs=dict(raw.get("kwargs") or {}),
                        source=source, client=_client_settings(raw.get("client")), preamble=preamble)
    except (KeyError, TypeError, ValueError) as err:
        raise ExplorerError(f"scenario {source} is malformed: {err}") from err
