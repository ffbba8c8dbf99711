"""Which prompt renderer each engine release really uses for a model, and what its request side is.

An engine column promises "what this engine at this version does to this model's conversation". Most models are
rendered from their Hub Jinja template (through transformers, with the engine's own handling of the messages and
of `chat_template_kwargs`), but some engines bypass the template for some model types: vLLM renders gpt-oss through
openai-harmony and DeepSeek V4 and V3.2 through the encoders it bundles (its deepseek_v4 and deepseek_v32 tokenizer
modes); SGLang renders DeepSeek V4 through its own copy of the encoder (0.5.12 … 0.5.22) or the deepseek-recipe
package (0.5.23), and DeepSeek V3.2 through its bundled V3.2 encoder; vLLM before 0.20 cannot parse Mistral 3's
calls without a tokenizer that is not here (its MistralTokenizer, from tekken.json). `RULES` is that table, keyed by
the engine's name, a release range and the model's `model_type` (config.json's, which is what the engines key on);
the first row that matches wins, and a model no row names is rendered from its Hub template.

    served_model(load_model("gpt-oss"), get_engine("vllm"))   # -> the same model rendered through openai-harmony

The engine's own renderer replaces the model's in the returned LoadedModel, so everything downstream (the
roundtrip, blame's re-renders, the cell's locations) uses it. Third-party code runs only in the engine's sandboxed
worker: an engine's bundled encoder is run there (engine/serving/real/encoder_trace.py), never imported here.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ExplorerError, RenderError
from engine.serving.spec import EngineSpec
from engine.types import Rendered, RenderRequest

if TYPE_CHECKING:
    from engine.models import LoadedModel
    from engine.render.constructs import Evaluation
    from engine.serving.base import EngineEmulation


@dataclass(frozen=True)
class ServingRule:
    """How the releases `first` ≤ v < `before` of `engine` render models of `model_type`."""

    engine: str
    model_type: str
    # "harmony" | "engine_encoder" | "deepseek_recipe" | "hub" (the model's own renderer) | "unavailable"
    renderer: str
    where: str  # the engine code that builds the prompt (at the newest release the row covers)
    first: str | None = None
    before: str | None = None
    missing: str = ""  # for "unavailable": the piece the release lacks, completing "{engine@version} …"
    encoder: str = ""  # for "engine_encoder": the encoder file inside the release

    def covers(self, engine: str, version: str, model_type: str) -> bool:
        from engine.serving.real.fetch import Version

        if engine != self.engine or model_type != self.model_type:
            return False
        release = Version(version)
        return (self.first is None or release >= Version(self.first)) and (
            self.before is None or release < Version(self.before))


RULES: tuple[ServingRule, ...] = (
    ServingRule("sglang", "deepseek_v32", "unavailable", "", before="0.5.6",
                missing="has no DeepSeek V3.2 renderer (its bundled encoding_dsv32.py arrived in 0.5.6) and the model "
                        "ships no chat template"),
    # 0.5.6-0.5.11 pick the encoder for a DeepseekV3 architecture without a chat template, 0.5.12 on for
    # --tool-call-parser deepseekv32 (resolved in chat_encoding.py from 0.5.16).
    ServingRule("sglang", "deepseek_v32", "engine_encoder", "sglang/srt/entrypoints/openai/serving_chat.py:279 "
                "(_use_dpsk_v32_encoding), 496-529", first="0.5.6", before="0.5.12",
                encoder="sglang/srt/entrypoints/openai/encoding_dsv32.py"),
    ServingRule("sglang", "deepseek_v32", "engine_encoder", "sglang/srt/entrypoints/openai/serving_chat.py:299 "
                "(dsv32), 751-815", first="0.5.12", before="0.5.16",
                encoder="sglang/srt/entrypoints/openai/encoding_dsv32.py"),
    ServingRule("sglang", "deepseek_v32", "engine_encoder", "sglang/srt/entrypoints/openai/chat_encoding.py:36 "
                "(dsv32), serving_chat.py:2075-2116", first="0.5.16",
                encoder="sglang/srt/entrypoints/openai/encoding_dsv32.py"),
    ServingRule("vllm", "deepseek_v32", "unavailable", "", before="0.13.0",
                missing="has no DeepSeek V3.2 renderer (its deepseek_v32 tokenizer mode, "
                        "vllm/tokenizers/deepseek_v32.py, arrived in 0.13.0) and the model ships no chat template"),
    # The deepseek_v32 tokenizer mode: --tokenizer-mode deepseek_v32, the default for a DeepseekV32ForCausalLM
    # checkpoint from 0.18.0 (vllm/config/model.py); its renderer hands the conversation to the wrapped tokenizer's
    # apply_chat_template, which calls the bundled encoder.
    ServingRule("vllm", "deepseek_v32", "engine_encoder", "vllm/tokenizers/deepseek_v32.py:22-60 (tokenizer mode "
                "deepseek_v32), vllm/renderers/deepseek_v32.py:35-60", first="0.13.0",
                encoder="vllm/tokenizers/deepseek_v32_encoding.py"),
    ServingRule("vllm", "gpt_oss", "unavailable", "", before="0.10.1",
                missing="predates gpt-oss: it has no harmony renderer (vLLM renders gpt-oss through openai-harmony "
                        "from 0.10.1)"),
    ServingRule("vllm", "gpt_oss", "harmony", "vllm/renderers/online_renderer.py:299-325, 547-600 "
                "(_make_request_with_harmony)", first="0.10.1"),
    ServingRule("vllm", "deepseek_v4", "unavailable", "", before="0.20.0",
                missing="has no DeepSeek V4 renderer (vllm/tokenizers/deepseek_v4.py arrived in 0.20.0) and the "
                        "model ships no chat template"),
    ServingRule("vllm", "deepseek_v4", "engine_encoder", "vllm/tokenizers/deepseek_v4.py:22-66",
                first="0.20.0", encoder="vllm/tokenizers/deepseek_v4_encoding.py"),
    # What Mistral 3 models write ([TOOL_CALLS]name[ARGS]{…}, tokenizer v11+) these releases parse only through vLLM's
    # MistralTokenizer; with the Hub tokenizer every call is returned as text. 0.20.0 reads [ARGS] in an HF vocabulary.
    ServingRule("vllm", "mistral3", "unavailable", "", before="0.20.0",
                missing="parses the [TOOL_CALLS]name[ARGS]{…} calls of Mistral 3 models only through its own "
                        "MistralTokenizer (--tokenizer-mode mistral; 0.19.1's vllm/tool_parsers/mistral_tool_parser.py"
                        ":69-70), built from the Hub's tekken.json, which no package here ships (with the Hub "
                        "tokenizer every call comes back as text; 0.20.0 reads [ARGS] in its vocabulary)"),
    ServingRule("sglang", "deepseek_v4", "unavailable", "", before="0.5.12",
                missing="has no DeepSeek V4 renderer (its bundled encoding_dsv4.py arrived in 0.5.12) and the "
                        "model ships no chat template"),
    ServingRule("sglang", "deepseek_v4", "engine_encoder", "sglang/srt/entrypoints/openai/serving_chat.py:751-810",
                first="0.5.12", before="0.5.16", encoder="sglang/srt/entrypoints/openai/encoding_dsv4.py"),
    # From 0.5.16 chat_encoding.py resolves the `dsv4` spec and serving_chat.py still calls the bundled encoder.
    ServingRule("sglang", "deepseek_v4", "engine_encoder", "sglang/srt/entrypoints/openai/chat_encoding.py:129 "
                "(dsv4), serving_chat.py:1570-1642", first="0.5.16", before="0.5.23",
                encoder="sglang/srt/entrypoints/openai/encoding_dsv4.py"),
    # 0.5.23 dropped encoding_dsv4.py: the `dsv4` spec's adapter renders through DeepSeek's deepseek-recipe package.
    ServingRule("sglang", "deepseek_v4", "deepseek_recipe", "sglang/srt/entrypoints/openai/chat_encoding.py:34 (dsv4), "
                "chat_encoding_adapters.py:293, serving_deepseek_recipe.py:100 encode_messages", first="0.5.23"),
)


# The worker's name for each bundled encoder (engine/serving/real/glue_*.py ENCODERS).
ENCODER_RENDERERS = {"encoding_dsv4.py": "deepseek_v4", "deepseek_v4_encoding.py": "deepseek_v4",
                     "encoding_dsv32.py": "deepseek_v32", "deepseek_v32_encoding.py": "deepseek_v32"}


def serving_rule(engine: str, version: str, model_type: str) -> ServingRule | None:
    return next((rule for rule in RULES if rule.covers(engine, version, model_type)), None)


class ServingUnavailable(ExplorerError):
    """The engine release cannot serve the model (no renderer); one sentence."""


@dataclass(frozen=True)
class ServingPath:
    """What a cell says about its request side: the renderer and the code that prepared the messages."""

    renderer: str
    request_side: str

    def to_json(self) -> dict[str, str]:
        return {"renderer": self.renderer, "request_side": self.request_side}


def serving_path(model: LoadedModel, emulation: EngineEmulation | None, column: EngineSpec) -> ServingPath:
    origin, source = model.renderer.origin, model.renderer.source_path
    template = model.spec.assets.get("chat_template")
    if model.served_from is None and template is not None and Path(template.path or "").name == source:
        # The manifest's template standing in for the model's own encoder (DeepSeek V3.2): said which it ports.
        port_of = model.spec.asset_extras.get("chat_template", {}).get("port_of")
        source = f"{source}: {port_of}" if port_of else source
    renderer = source if source.startswith(origin) else f"{origin} ({source})"
    if emulation is None:
        side = "none: the client's messages as sent" if column.kind == "raw" else \
            "none: the previous prompt and completion kept, the new messages rendered"
        return ServingPath(renderer, side)
    if model.served_from is not None:  # the engine's own renderer runs the request side too
        side = getattr(model.renderer, "request_side", None) or (
            "vLLM 0.33.0's harmony request side (vllm/renderers/online_renderer.py:547-600 "
            "_make_request_with_harmony), as engine/render/harmony.py re-implements it")
        return ServingPath(renderer, side)
    return ServingPath(renderer, emulation.request_side_origin)


def cell_model(cell: Any, model: LoadedModel) -> LoadedModel:
    """The model as a cell's engine rendered it (an error note's template lines index into its renderer)."""
    if not cell.engine_version:  # raw and bridge have no release
        return model.served_from or model
    from engine.serving.registry import get_engine

    try:  # the cell's engine and version fields (as a result file has them) name the release
        return served_model(model, get_engine(EngineSpec.parse(f"{cell.engine}@{cell.engine_version}")))
    except (ValueError, ExplorerError):
        return model


def served_model(model: LoadedModel, emulation: EngineEmulation) -> LoadedModel:
    """`model` as `emulation`'s engine release renders it (the same object when that is its own renderer); raises
    ServingUnavailable when the release has no renderer for it."""
    base = model.served_from or model
    rule = serving_rule(emulation.name, emulation.version, base.spec.model_type)
    if rule is None or rule.renderer == "hub":
        return base
    if rule.renderer == "unavailable":
        raise ServingUnavailable(f"{emulation.name}@{emulation.version} cannot serve {base.id}: it {rule.missing}.")
    if model.served_from is not None and model.served_by == emulation.spec:
        return model
    return _served(base, rule, emulation.version)


@functools.lru_cache(maxsize=32)
def _served_cached(model_id: str, rule: ServingRule, version: str) -> LoadedModel:
    from engine.models import load_model

    return _build_served(load_model(model_id), rule, version)


def _served(base: LoadedModel, rule: ServingRule, version: str) -> LoadedModel:
    from engine.models import load_model

    if base is load_model(base.id):  # the stock model: one served copy per engine release (renders are cached)
        return _served_cached(base.id, rule, version)
    return _build_served(base, rule, version)


def _build_served(base: LoadedModel, rule: ServingRule, version: str) -> LoadedModel:
    from engine.models import build_renderer
    from engine.render.cache import CachedRenderer

    renderer: Any
    if rule.renderer == "harmony":
        renderer, _ = build_renderer(base.spec, "harmony")
        hashes = dict(base.asset_hashes)
    elif rule.renderer == "deepseek_recipe":
        from engine.render.deepseek_recipe import SglangDeepSeekRecipeRenderer

        renderer = SglangDeepSeekRecipeRenderer(base.tokenizer, rule.engine, version, rule.where)
        hashes = dict(base.asset_hashes)
    else:
        renderer = EngineEncoderRenderer(rule, version, base)
        hashes = {**base.asset_hashes, rule.encoder: renderer.sha256}
    return dataclasses.replace(base, renderer=CachedRenderer(renderer), asset_hashes=hashes, served_from=base,
                               served_by=f"{rule.engine}@{version}")


class EngineEncoderRenderer:
    """A model rendered by the Python encoder an engine release bundles, run in that release's sandboxed worker
    through the release's own request-side code (engine/serving/real/glue_*.py `render`)."""

    understood_kwargs = ("thinking", "enable_thinking", "reasoning_effort", "drop_thinking")

    def __init__(self, rule: ServingRule, version: str, model: LoadedModel) -> None:
        import hashlib

        from engine.serving.real import fetch
        from engine.serving.real.backend import RealEngine

        self.engine, self.version, self.model = rule.engine, version, model
        self.real = RealEngine(rule.engine, version)
        try:
            sources = fetch.fetch_sources(rule.engine, version)
        except fetch.FetchError as err:
            raise ServingUnavailable(f"{rule.engine}@{version} renders {model.id} with the encoder it bundles "
                                     f"({rule.encoder}), whose source is not here: {err}") from err
        self.origin = f"{rule.engine} {version} encoder"
        self.source_path = rule.encoder
        self.job_renderer = ENCODER_RENDERERS[Path(rule.encoder).name]
        self.request_side = f"{rule.engine} {version} real code ({rule.where})"
        path = sources.root / rule.encoder
        self._lines = path.read_text(encoding="utf-8").splitlines()
        self._table: Any = None
        self.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()

    def source_lines(self) -> list[str]:
        return list(self._lines)

    def construct_table(self) -> Any:
        """The encoder's constructs (engine.render.constructs), read from its source text here (nothing runs): the
        same numbering the worker's instrumented run uses."""
        if self._table is None:
            import ast

            from engine.render.constructs import PythonRewriter
            from engine.render.deepseek_v4 import REPRINTING_FUNCTIONS

            rewriter = PythonRewriter(REPRINTING_FUNCTIONS)
            rewriter.visit(ast.parse("\n".join(self._lines) + "\n", self.source_path))
            self._table = rewriter.table()
        return self._table

    def render_counterfactual(self, request: RenderRequest, *, undo_from: int | None = None,
                              undo: frozenset[int] = frozenset(), substitute: dict[int, dict[str, str]] | None = None
                              ) -> tuple[str, list[Evaluation]]:
        """The prompt with encoder constructs undone from message `undo_from` on, run in the worker over the
        arguments the release's own request side gave the encoder (see DeepSeekV4Renderer.render_counterfactual)."""
        from engine.render.constructs import Evaluation

        job = {**self._job(request.messages, request.tools, request.kwargs),
               "counterfactual": {"undo_from": undo_from, "undo": sorted(undo), "substitute": substitute or {}}}
        reply = self.real.render_request(job).get("counterfactual")
        if reply is None:
            raise RenderError(f"{self.model.id}: {self.source_path} of {self.engine} {self.version} gave no "
                              "counterfactual run", model=self.model.id, path=self.source_path)
        return reply["prompt"], [Evaluation(*row) for row in reply["evaluations"]]

    def render(self, messages: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool = True,
               kwargs: dict | None = None) -> Rendered:
        job = self._job(messages, tools, kwargs)
        reply = self.real.render_request(job)
        if "unsupported" in reply:  # a release whose request side the worker's glue does not drive
            raise RenderError(f"{self.model.id}: {self.source_path} of {self.engine} {self.version} is not run here: "
                              f"{reply['unsupported']}", model=self.model.id, path=self.source_path)
        text = reply["prompt"]

        def provenance() -> tuple[tuple[int, ...], tuple[int, ...]]:
            traced = self.real.render_request({**job, "provenance": True})
            if traced.get("prompt") != text or "provenance" not in traced:
                raise RenderError(f"{self.model.id}: {self.source_path} of {self.engine} {self.version} gave no "
                                  f"per-character provenance ({traced.get('provenance_error', 'a different prompt')})",
                                  model=self.model.id, path=self.source_path)
            return tuple(traced["provenance"]["message_index"]), tuple(traced["provenance"]["source_line"])

        return Rendered(text=text, source_path=self.source_path, origin=self.origin, provenance=provenance)

    def _job(self, messages: list[dict], tools: list[dict] | None, kwargs: dict | None) -> dict[str, Any]:
        parsers = self.model.spec.engine_parsers.get(self.engine, {})
        return {"renderer": self.job_renderer, "messages": messages, "tools": tools or None,
                "chat_template_kwargs": dict(kwargs or {}), "model_type": self.model.spec.model_type,
                "message_count": len(messages), "reasoning_parser": parsers.get("reasoning_parser"),
                "tool_parser": parsers.get("tool_call_parser")}
