"""A whole agent task as a chain of requests: what each request reuses from the prefix cache and what it prefills.

The accounting follows the inference handbook (seed 003): request k's prompt is compared with the whole sequence of
request k-1 (its prompt plus its generation, rendered with add_generation_prompt=False); the common token prefix
is what a prefix cache can reuse. Two cache designs refine it: block-granular reuse (only whole blocks are cached,
as vLLM's block hashes; block size 1 is SGLang's token-level radix tree) and a hybrid (linear-attention) model whose
state exists only at checkpoints, by default the end of each prompt and of each generation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError
from engine.models import LoadedModel
from engine.prefix import common_prefix

SESSIONS_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "sessions"


@dataclass(frozen=True)
class SessionScript:
    id: str
    description: str
    tools: list[dict] | None
    system: str
    steps: list[dict]  # user / tool messages, and the scripted assistant replies between them
    kwargs: dict[str, Any] = field(default_factory=dict)
    unrelated_questions: tuple[str, ...] = ()
    timestamp_template: str = ""
    timestamp_seconds: tuple[int, ...] = ()


def session_ids() -> list[str]:
    return sorted(p.stem for p in SESSIONS_DIR.glob("*.json"))


def load_session(name_or_path: str) -> SessionScript:
    path = Path(name_or_path)
    if not path.is_file():
        path = SESSIONS_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(session_ids())
        raise ExplorerError(f"no session script {name_or_path!r}: not a file, and not one of {known}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        stamp = raw.get("timestamp", {})
        return SessionScript(
            id=raw.get("id", path.stem),
            description=raw.get("description", ""),
            tools=raw.get("tools"),
            system=raw.get("system", ""),
            steps=list(raw["steps"]),
            kwargs=dict(raw.get("kwargs", {})),
            unrelated_questions=tuple(raw.get("unrelated_questions", ())),
            timestamp_template=stamp.get("template", ""),
            timestamp_seconds=tuple(stamp.get("seconds", ())),
        )
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise ExplorerError(f"session script {path} is malformed: {err}") from err


@dataclass(frozen=True)
class RequestRow:
    index: int  # 1-based request number
    trigger: str  # "user", "tool", "next user"
    prompt_tokens: int
    reusable_tokens: int  # token-level common prefix with the previous request's whole sequence
    prefill_tokens: int
    decode_tokens: int | None  # None for the last request, whose reply is not scripted
    block_reusable_tokens: int
    hybrid_reusable_tokens: int
    sequence_tokens: int  # prompt + generation

    @property
    def block_prefill_tokens(self) -> int:
        return self.prompt_tokens - self.block_reusable_tokens

    @property
    def hybrid_prefill_tokens(self) -> int:
        return self.prompt_tokens - self.hybrid_reusable_tokens


@dataclass(frozen=True)
class SessionReport:
    model: str
    script: str
    kwargs: dict[str, Any]
    block_size: int
    checkpoint_policy: str
    rows: tuple[RequestRow, ...]

    @property
    def total_prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.rows)

    @property
    def total_prefill_tokens(self) -> int:
        return sum(r.prefill_tokens for r in self.rows)

    @property
    def total_block_prefill_tokens(self) -> int:
        return sum(r.block_prefill_tokens for r in self.rows)

    @property
    def total_hybrid_prefill_tokens(self) -> int:
        return sum(r.hybrid_prefill_tokens for r in self.rows)

    @property
    def total_decode_tokens(self) -> int:
        return sum(r.decode_tokens or 0 for r in self.rows)


CHECKPOINT_POLICIES = ("prompt-and-generation-end", "generation-end", "none")


def block_reusable(common: int, block_size: int) -> int:
    """Tokens a block-granular cache reuses: only whole blocks inside the common prefix."""
    return (common // block_size) * block_size


def _checkpoints_after(prompt_len: int, sequence_len: int, policy: str) -> list[int]:
    if policy == "prompt-and-generation-end":
        return [prompt_len, sequence_len]
    if policy == "generation-end":
        return [sequence_len]
    if policy == "none":
        return []
    raise ExplorerError(f"unknown checkpoint policy {policy!r}; known: {', '.join(CHECKPOINT_POLICIES)}")


def _encoder(model: LoadedModel, script: SessionScript, kwargs: dict[str, Any] | None):
    """The template kwargs this script runs with, and a function rendering + tokenizing messages with them."""
    if model.tokenizer is None:
        raise ExplorerError(model.tokenizer_unavailable or f"model {model.id} has no tokenizer")
    tokenizer = model.tokenizer
    template_kwargs = {**model.spec.default_kwargs(), **script.kwargs, **(kwargs or {})}

    def encode(messages: list[dict], generation_prompt: bool) -> list[int]:
        rendered = model.renderer.render(messages, script.tools, add_generation_prompt=generation_prompt,
                                         kwargs=template_kwargs)
        return list(tokenizer.encode(rendered.text).ids)

    return template_kwargs, encode


def simulate_session(
    model: LoadedModel,
    script: SessionScript,
    *,
    kwargs: dict[str, Any] | None = None,
    block_size: int = 16,
    checkpoint_policy: str = "prompt-and-generation-end",
) -> SessionReport:
    if block_size < 1:
        raise ExplorerError(f"block size must be at least 1, got {block_size}")
    template_kwargs, encode = _encoder(model, script, kwargs)

    history: list[dict] = [{"role": "system", "content": script.system}] if script.system else []
    previous: list[int] = []
    checkpoints: list[int] = []
    rows: list[RequestRow] = []
    seen_assistant = False
    for i, message in enumerate(script.steps):
        history.append(message)
        if message["role"] == "assistant":
            seen_assistant = True
            continue
        prompt = encode(history, True)
        common = common_prefix(prompt, previous)
        hybrid = max((c for c in checkpoints if c <= common), default=0)
        reply = next((m for m in script.steps[i + 1:] if m["role"] == "assistant"), None)
        sequence = encode(history + [reply], False) if reply else prompt
        trigger = "tool" if message["role"] == "tool" else ("next user" if seen_assistant else "user")
        rows.append(RequestRow(
            index=len(rows) + 1,
            trigger=trigger,
            prompt_tokens=len(prompt),
            reusable_tokens=common,
            prefill_tokens=len(prompt) - common,
            decode_tokens=len(sequence) - len(prompt) if reply else None,
            block_reusable_tokens=block_reusable(common, block_size),
            hybrid_reusable_tokens=hybrid,
            sequence_tokens=len(sequence),
        ))
        checkpoints += _checkpoints_after(len(prompt), len(sequence), checkpoint_policy)
        previous = sequence
    return SessionReport(model.id, script.id, template_kwargs, block_size, checkpoint_policy, tuple(rows))


def first_request_prompt(model: LoadedModel, script: SessionScript, system: str, question: str,
                         kwargs: dict[str, Any] | None = None) -> list[int]:
    _, encode = _encoder(model, script, kwargs)
    return encode([{"role": "system", "content": system}, {"role": "user", "content": question}], True)


def shared_across_sessions(model: LoadedModel, script: SessionScript, kwargs: dict[str, Any] | None = None) -> int:
    """Tokens two unrelated sessions' first requests share (tools + system prompt)."""
    a, b = (first_request_prompt(model, script, script.system, q, kwargs) for q in script.unrelated_questions[:2])
    return common_prefix(a, b)


def shared_with_timestamp(model: LoadedModel, script: SessionScript, where: str,
                          kwargs: dict[str, Any] | None = None) -> int:
    """Tokens two unrelated sessions share when the system prompt carries the current time at its `start`/`end`."""
    if where not in ("start", "end"):
        raise ExplorerError(f"timestamp position must be start or end, got {where!r}")
    prompts = []
    for second, question in zip(script.timestamp_seconds, script.unrelated_questions):
        stamp = script.timestamp_template.format(second=second)
        system = stamp + script.system if where == "start" else script.system + stamp
        prompts.append(first_request_prompt(model, script, system, question, kwargs))
    return common_prefix(prompts[0], prompts[1])
