"""Scenarios are data (`scenarios/*.yaml`): model-independent scripts of turns plus the output knobs they set.

A scenario id from outside (a link, `--scenarios`, evidence) is looked up among `scenario_ids()`, never used as a
path. YAML is read by `load_yaml`: the safe loader, at most 1 MB and 32 aliases, each refusal one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import yaml

from engine.errors import ExplorerError
from engine.formats.base import AssistantTurn, Knobs, ToolCallSpec

SCENARIOS_DIR = Path(__file__).resolve().parent.parent / "scenarios"
MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 32  # none of our files needs one; a few cannot expand into a bomb


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, counting aliases: nested aliases expand exponentially ("billion laughs")."""

    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise yaml.YAMLError(f"it uses more than {MAX_YAML_ALIASES} aliases")
        return super().compose_node(parent, index)


def load_yaml(data: bytes | str, source: str) -> Any:
    """A YAML document through the safe loader under the size and alias limits; ExplorerError names `source`."""
    size = len(data.encode("utf-8") if isinstance(data, str) else data)
    if size > MAX_YAML_BYTES:
        raise ExplorerError(f"{source} is {size:,} bytes, over the {MAX_YAML_BYTES:,}-byte limit for YAML files")
    try:
        return yaml.load(data, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ExplorerError(f"{source} is not usable YAML: {problem}{where}") from None
    except RecursionError:
        raise ExplorerError(f"{source} is not usable YAML: it is nested too deeply") from None


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
    return load_yaml((SCENARIOS_DIR / "tools.yaml").read_bytes(), "scenarios/tools.yaml")


@cache
def preamble_library() -> dict[str, str]:
    return load_yaml((SCENARIOS_DIR / "preambles.yaml").read_bytes(), "scenarios/preambles.yaml")


LIBRARY_FILES = ("tools", "preambles")  # scenarios/*.yaml that hold what scenarios refer to, not scenarios


def scenario_ids() -> list[str]:
    # Asked for every cell: the folder is listed again only when its entries change (its mtime).
    return list(_scenario_ids(SCENARIOS_DIR.stat().st_mtime_ns))


@lru_cache(maxsize=4)
def _scenario_ids(_folder_mtime_ns: int) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml") if p.stem not in LIBRARY_FILES))


def load_scenario(scenario_id: str) -> Scenario:
    """The scenario of that id; an id that is not one of `scenario_ids()` is one sentence, never a path."""
    known = scenario_ids()
    if not isinstance(scenario_id, str) or scenario_id not in known:
        shown = repr(scenario_id)[:80] if isinstance(scenario_id, str) else f"of type {type(scenario_id).__name__}"
        raise ExplorerError(f"unknown scenario {shown}; known: {', '.join(known)}")
    return _load_scenario(scenario_id)


@cache
def _load_scenario(scenario_id: str) -> Scenario:
    path = SCENARIOS_DIR / f"{scenario_id}.yaml"
    source = str(path.relative_to(SCENARIOS_DIR.parent))
    raw = load_yaml(path.read_bytes(), source)
    if not isinstance(raw, dict):
        raise ExplorerError(f"scenario {source} is malformed: it must be a mapping")
    return scenario_from_data(raw, source)


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
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ExplorerError(f"scenario {source} is malformed: {err}"[:300]) from err
