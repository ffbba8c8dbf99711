"""The proof behind an engine column: every prompt the column renders, next to what that engine release's own
request-side code renders for the same request (run from the release's sources in its sandboxed worker).

    proofs = prove_cell("gpt-oss", "tool-call", "vllm")
    all(p.equal for p in proofs)

For a model the release renders from its Jinja template, the release's code prepares the request (protocol
validation, message handling, template kwargs and tools as it resolves them) up to transformers'
apply_chat_template, and the model's template renders what it was handed; where the release renders the model itself
(openai-harmony, a bundled encoder) its prompt is taken as it is, with harmony's own token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models import LoadedModel, load_model
from engine.serving.rendering import ENCODER_RENDERERS, served_model, serving_rule
from engine.serving.spec import EngineSpec
from engine.tokenize import token_ids


@dataclass(frozen=True)
class RequestProof:
    """One request of a cell: the prompt the column rendered and the one the engine's code rendered."""

    boundary: int
    column_text: str
    engine_text: str
    column_ids: tuple[int, ...] | None
    engine_ids: tuple[int, ...] | None

    @property
    def equal(self) -> bool:
        return self.column_text == self.engine_text and self.column_ids == self.engine_ids

    def first_difference(self) -> str:
        """Where the two prompts part, in one sentence (for a failing test)."""
        a, b = self.column_text, self.engine_text
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if a == b:
            return f"boundary {self.boundary}: the texts agree, the token ids do not"
        return (f"boundary {self.boundary}: the prompts part at character {at}: column {a[max(0, at - 60):at + 60]!r}"
                f" vs engine {b[max(0, at - 60):at + 60]!r}")


def engine_prompt(model: LoadedModel, engine: EngineSpec | str, sent: list[dict], tools: list[dict] | None,
                  kwargs: dict[str, Any]) -> tuple[str, tuple[int, ...] | None]:
    """The prompt (and ids) `engine`'s release renders for this request with its own request-side code."""
    from engine.serving.real.backend import RealEngine
    from engine.serving.registry import get_engine

    emulation = get_engine(engine)
    real = RealEngine(emulation.name, emulation.version)
    rule = serving_rule(emulation.name, emulation.version, model.spec.model_type)
    kind = rule.renderer if rule is not None else "hub"
    parsers = model.spec.engine_parsers.get(emulation.name, {})
    job: dict[str, Any] = {"messages": sent, "tools": tools or None, "model_type": model.spec.model_type,
                           "reasoning_parser": parsers.get("reasoning_parser"),
                           "tool_parser": parsers.get("tool_call_parser")}
    if kind == "harmony":
        others = {k: v for k, v in kwargs.items() if k != "reasoning_effort"}
        reply = real.render_request({**job, "renderer": "harmony", "harmony": True,
                                     "reasoning_effort": kwargs.get("reasoning_effort"),
                                     "chat_template_kwargs": others or None}, model.tokenizer)
        return reply["prompt"], tuple(reply["prompt_ids"])
    if kind == "deepseek_recipe":
        return served_model(model, emulation).renderer.prompt(sent, tools, kwargs)
    if kind == "engine_encoder":
        reply = real.render_request({**job, "renderer": ENCODER_RENDERERS[Path(rule.encoder).name],
                                     "chat_template_kwargs": dict(kwargs)})
        return reply["prompt"], _ids(model, reply["prompt"])
    source = getattr(model.renderer, "template_source", None)
    if not isinstance(source, str):
        raise ValueError(f"{engine} renders {model.id} with its own renderer, which no proof here drives yet")
    prep = real.prepare_templated_request(sent, tools, kwargs=kwargs, chat_template=source, parsers=parsers)
    if prep.error:
        raise ValueError(prep.error)
    from engine.simulate import template_kwargs_of

    text = model.renderer.render(prep.messages, prep.tools, add_generation_prompt=True,
                                 kwargs=template_kwargs_of(prep, kwargs)).text
    return text, _ids(model, text)


def prove_cell(model_id: str, scenario_id: str, engine: EngineSpec | str, kwargs: dict[str, Any] | None = None
               ) -> list[RequestProof]:
    """Every next prompt of the cell beside the engine's own rendering of the same client request."""
    from engine.scenario import load_scenario
    from engine.simulate import run_cell

    engine = EngineSpec.of(engine)
    cell = run_cell(model_id, scenario_id, engine, kwargs, explain=False)
    model = load_model(model_id)
    tools = load_scenario(scenario_id).tools
    proofs = []
    for boundary in cell.boundaries:
        request = boundary.next_request
        if request is None or request.sent is None:
            continue
        text, ids = engine_prompt(model, engine, request.sent, tools, cell.kwargs)
        proofs.append(RequestProof(boundary.index, boundary.next_prompt.text, text, boundary.next_ids, ids))
    return proofs


def _ids(model: LoadedModel, text: str) -> tuple[int, ...] | None:
    return token_ids(model.tokenizer, text) if model.tokenizer is not None else None
