"""Client and gateway profiles: the common rewrites of the history a client sends, as data (`proxy_profiles/*.yaml`),
each step cited to the code it models.

    id: langchain-openai
    description: ...
    code: langchain-openai 1.8.1, langchain_openai/chat_models/base.py:476-558 (_convert_message_to_dict)
    request:
      assistant:                     # applied to every assistant message the client sends, in order
        - drop: reasoning_content    # the field is not sent
          cite: "base.py:481-516: ..."
        - rename: reasoning_content  # the field is sent under another name
          to: reasoning
        - empty_content: null        # content "" is sent as null (`when: tool_calls`: only beside tool calls)

A column names a profile by its id after the engine (`raw+langchain-openai`, `vllm+reasoning-field`); each rewrite is
an Edit located at the step's line of the profile file, its text the step's citation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ExplorerError
from engine.serving.proxies.base import Forwarded, LayerUnavailable
from engine.types import Edit, Location

PROFILES_DIR = Path(__file__).resolve().parents[3] / "proxy_profiles"
_OPS = ("drop", "rename", "empty_content")


@dataclass(frozen=True)
class ProfileStep:
    op: str  # drop | rename | empty_content
    field: str  # the message field (content for empty_content)
    to: str | None  # rename: the new name
    when: str | None  # only in a message that has this field (empty_content: tool_calls)
    cite: str
    line: int  # the step's line in the profile file


@dataclass(frozen=True)
class ClientProfile:
    id: str
    description: str
    code: str
    steps: tuple[ProfileStep, ...]
    path: str  # relative to the repository

    @property
    def name(self) -> str:
        return self.id

    @property
    def label(self) -> str:
        return f"{self.id} (client profile: {self.code})"

    def _location(self, step: ProfileStep) -> Location:
        return Location(f"profile {self.id}", self.path, step.line, text=step.cite)

    def request(self, messages: list[dict], tools: list[dict] | None) -> Forwarded:
        out: list[dict] = []
        edits: list[Edit] = []
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                out.append(message)
                continue
            changed = dict(message)
            for step in self.steps:
                if step.when is not None and not changed.get(step.when):
                    continue
                where = f"messages[{index}]"
                if step.op == "drop" and step.field in changed:
                    changed.pop(step.field)
                    edits.append(Edit(f"{step.field}_dropped", f"{where}.{step.field}", "", self._location(step),
                                      f"{self.id} does not send {where}.{step.field}"))
                elif step.op == "rename" and step.field in changed and step.to:
                    changed[step.to] = changed.pop(step.field)
                    edits.append(Edit(f"{step.field}_renamed", f"{where}.{step.field}", f"{where}.{step.to}",
                                      self._location(step), f"{self.id} sends {step.field} as {step.to}"))
                elif step.op == "empty_content" and changed.get("content") == "":
                    changed["content"] = None
                    edits.append(Edit("content_changed", f'{where}.content=""', f"{where}.content=null",
                                      self._location(step), f"{self.id} sends an empty content as null"))
            out.append(changed)
        return Forwarded(out, tools, tuple(edits))

    def response(self, message: dict) -> tuple[dict, tuple[Edit, ...]]:
        return message, ()


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


@functools.cache
def profile(name: str) -> ClientProfile:
    """The profile `name` names (`proxy_profiles/NAME.yaml`); LayerUnavailable in one sentence for an unknown or a
    malformed one."""
    if name not in profile_names():
        raise LayerUnavailable(f"unknown proxy {name[:40]!r}; known: litellm (litellm@VERSION), "
                               f"{', '.join(profile_names())}")
    path = PROFILES_DIR / f"{name}.yaml"
    relative = f"{PROFILES_DIR.name}/{path.name}"
    try:
        return _parse(path.read_text(encoding="utf-8"), relative)
    except (ExplorerError, KeyError, TypeError, ValueError) as err:
        raise LayerUnavailable(f"{relative} is not a client profile: {err}") from None


def _parse(text: str, relative: str) -> ClientProfile:
    from engine.scenario import load_yaml

    raw = load_yaml(text, relative)
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("id", "description", "code")):
        raise ValueError("it needs id, description and code (the code it models) as text")
    lines = text.splitlines()
    steps: list[ProfileStep] = []
    cursor = 0
    for item in ((raw.get("request") or {}).get("assistant") or []):
        if not isinstance(item, dict) or not isinstance(item.get("cite"), str):
            raise ValueError(f"each step names one of {', '.join(_OPS)} and cites the code it models")
        op = next((o for o in _OPS if o in item), None)
        if op is None:
            raise ValueError(f"a step names none of {', '.join(_OPS)}")
        cursor = next((n for n in range(cursor, len(lines)) if lines[n].lstrip(" -").startswith(f"{op}:")), cursor)
        field = "content" if op == "empty_content" else str(item[op])
        if op == "empty_content" and item[op] is not None:
            raise ValueError("empty_content takes null (the empty content is sent as null)")
        if op == "rename" and not isinstance(item.get("to"), str):
            raise ValueError("a rename names the new field with `to`")
        steps.append(ProfileStep(op, field, item.get("to"), item.get("when"), item["cite"], cursor + 1))
        cursor += 1
    if not steps:
        raise ValueError("it has no request.assistant steps")
    return ClientProfile(raw["id"], raw["description"], raw["code"], tuple(steps), relative)
