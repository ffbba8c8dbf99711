"""Model registry: one manifest per model in `model_assets/<id>/model.toml`, loaded into a `ModelSpec`.

`load_model` turns a spec into a `LoadedModel` (renderer + tokenizer, each from the real files); loading is cached
per process because tokenizers take a second each.
"""

from __future__ import annotations

import gc
import tomllib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from engine.assets import AssetSpec, ResolvedAsset, resolve_asset
from engine.errors import AssetError, ExplorerError
from engine.render import Renderer
from engine.render.cache import CachedRenderer
from engine.render_store import PersistedRenders
from engine.tokenize import Tokenizer, load_hf_tokenizer, segment_cached_hf, segment_cached_tiktoken

MODEL_ASSETS = Path(__file__).resolve().parent.parent / "model_assets"
_ASSET_FIELDS = set(AssetSpec.__dataclass_fields__)


@dataclass(frozen=True)
class TemplateKwarg:
    name: str
    default: Any
    help: str = ""
    choices: tuple[Any, ...] = ()  # the values a non-boolean kwarg takes (gpt-oss reasoning_effort: low/medium/high)


@dataclass(frozen=True)
class ModelSpec:
    id: str
    display_name: str
    hub_repo: str
    family: str  # output format family: a module in engine/formats/
    renderer: str  # default renderer: "jinja", "deepseek_v4", "harmony"
    renderers: tuple[str, ...]
    assets: dict[str, AssetSpec]
    asset_extras: dict[str, dict[str, Any]]
    template_kwargs: tuple[TemplateKwarg, ...]
    special_tokens: dict[str, Any]
    engine_parsers: dict[str, dict[str, str]]  # engine name -> {"reasoning_parser": ..., "tool_call_parser": ...}
    manifest_path: Path = field(compare=False)
    # config.json's model_type, which engines key their own renderers on (engine/serving/rendering.py); "" for a
    # model every engine renders from its Hub template.
    model_type: str = ""
    # When the model's turns carry reasoning: "always" (the scenario's, as written), "prompt" (only after a
    # generation prompt that leaves a think block open: thinking on), "never" (a model that does not think).
    reasoning: str = "always"
    # The tokenizer's added tokens (text -> id, from the Hub's tokenizer_config.json) for a model whose tokenizer is
    # not offline: the real engines' parsers look their markers up in the vocabulary.
    added_tokens: dict[str, int] = field(default_factory=dict)

    def default_kwargs(self) -> dict[str, Any]:
        return {k.name: k.default for k in self.template_kwargs}

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        return tuple(self.special_tokens.get("stop", ()))


def model_ids() -> list[str]:
    return sorted(p.parent.name for p in MODEL_ASSETS.glob("*/model.toml"))


# The order people read the matrix in: the seed article's five models, with the handbook's Qwen3.5 beside Qwen3.6,
# then the models served most in engine and RL-framework threads (issue 20).
DEFAULT_ORDER = ("qwen3.6", "qwen3.5", "glm-5.1", "kimi-k2.6", "deepseek-v4", "gpt-oss",
                 "qwen3-coder", "qwen3-2507", "qwen2.5", "glm-4.7-flash", "deepseek-v3.1",
                 "minimax-m2.7", "deepseek-v3.2", "llama-3.1", "mistral-small-3.2")


def default_model_ids() -> list[str]:
    known = model_ids()
    return [m for m in DEFAULT_ORDER if m in known] + [m for m in known if m not in DEFAULT_ORDER]


@cache
def load_spec(model_id: str) -> ModelSpec:
    # An id from outside (a link, evidence, the CLI) is looked up among the known ones, never used as a path.
    if not isinstance(model_id, str) or model_id not in model_ids():
        shown = repr(model_id)[:80] if isinstance(model_id, str) else f"of type {type(model_id).__name__}"
        raise ExplorerError(f"unknown model {shown}; known models: {', '.join(model_ids())}")
    path = MODEL_ASSETS / model_id / "model.toml"
    if not path.is_file():
        raise ExplorerError(f"unknown model {model_id!r}: no {path}; known models: {', '.join(model_ids())}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ExplorerError(f"{path} for model {model_id} is not valid TOML: {err}") from err
    return spec_from_manifest(raw, path)


def spec_from_manifest(raw: dict[str, Any], path: Path) -> ModelSpec:
    model_id = raw.get("id", path.parent.name)
    try:
        assets: dict[str, AssetSpec] = {}
        extras: dict[str, dict[str, Any]] = {}
        for name, entry in raw.get("assets", {}).items():
            assets[name] = AssetSpec(name=name, **{k: v for k, v in entry.items() if k in _ASSET_FIELDS})
            extras[name] = {k: v for k, v in entry.items() if k not in _ASSET_FIELDS}
        kwargs = tuple(
            TemplateKwarg(name=k, default=v.get("default"), help=v.get("help", ""), choices=tuple(v.get("choices", ())))
            for k, v in raw.get("template_kwargs", {}).items()
        )
        return ModelSpec(
            id=model_id,
            display_name=raw.get("display_name", model_id),
            hub_repo=raw.get("hub_repo", ""),
            family=raw["family"],
            renderer=raw.get("renderer", "jinja"),
            renderers=tuple(raw.get("renderers", [raw.get("renderer", "jinja")])),
            assets=assets,
            asset_extras=extras,
            template_kwargs=kwargs,
            special_tokens=dict(raw.get("special_tokens", {})),
            engine_parsers={k: dict(v) for k, v in raw.get("engines", {}).items()},
            manifest_path=path,
            model_type=str(raw.get("model_type", "")),
            reasoning=_reasoning_mode(raw.get("reasoning", "always"), path),
            added_tokens={str(k): int(v) for k, v in raw.get("added_tokens", {}).items()},
        )
    except (KeyError, TypeError) as err:
        raise ExplorerError(f"{path} for model {model_id} is missing or has a malformed field: {err}") from err


REASONING_MODES = ("always", "prompt", "never")


def _reasoning_mode(value: Any, path: Path) -> str:
    if value not in REASONING_MODES:
        raise ExplorerError(f"{path}: reasoning = {value!r} is not one of {', '.join(REASONING_MODES)}")
    return str(value)


@dataclass
class LoadedModel:
    spec: ModelSpec
    renderer: Renderer
    tokenizer: Tokenizer | None
    tokenizer_unavailable: str | None  # the sentence saying why, and how to supply one
    asset_hashes: dict[str, str]
    asset_sources: dict[str, str]
    # Set on a copy rendered the way one engine release renders it (engine.serving.rendering.served_model): the
    # model it was made from and that release ("vllm@0.33.0").
    served_from: LoadedModel | None = None
    served_by: str | None = None

    @property
    def id(self) -> str:
        return self.spec.id


# transformers' named special tokens (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES), in its order
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def listed_special_tokens(spec: ModelSpec) -> tuple[str, ...] | None:
    """What transformers lists in the model's `all_special_tokens`: its tokenizer_config.json's named special tokens,
    then its extra (additional) ones, where the manifest records those (`extra_special_tokens`, [] for none); None
    where it does not, and the tokenizer.json's special flags stand in (the same set for the Qwen, GLM and MiniMax
    models: tests/test_special_tokens.py). DeepSeek's tokenizer.json flags ~800-1,230 added tokens special and its
    tokenizer_config.json names only bos and eos."""
    extra = spec.special_tokens.get("extra_special_tokens")
    if extra is None:
        return None
    named = [spec.special_tokens[k] for k in NAMED_SPECIAL_TOKENS if isinstance(spec.special_tokens.get(k), str)]
    return tuple(dict.fromkeys([*named, *map(str, extra)]))


def special_token_vars(spec: ModelSpec) -> dict[str, str]:
    # transformers passes bos_token/eos_token/... from the tokenizer config into every render.
    return {k: v for k, v in spec.special_tokens.items() if k.endswith("_token") and isinstance(v, str)}


def build_renderer(spec: ModelSpec, kind: str, assets_dir: Path | None = None) -> tuple[Renderer, ResolvedAsset]:
    if kind == "jinja":
        from engine.render.jinja import JinjaRenderer

        asset = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"], assets_dir)
        source = asset.data.decode("utf-8")
        return JinjaRenderer(source, model=spec.id, source_path=Path(spec.assets["chat_template"].path).name or
                             asset.name, special_tokens=special_token_vars(spec)), asset
    if kind == "deepseek_v4":
        from engine.render.deepseek_v4 import DeepSeekV4Renderer, load_encoder_module

        asset = resolve_asset(spec.id, spec.hub_repo, spec.assets["encoder"], assets_dir)
        return DeepSeekV4Renderer(load_encoder_module(asset.path)), asset
    if kind == "harmony":
        from engine.render.harmony import HarmonyRenderer

        asset = resolve_asset(spec.id, spec.hub_repo, spec.assets["chat_template"], assets_dir)
        return HarmonyRenderer(), asset
    raise ExplorerError(f"model {spec.id}: unknown renderer {kind!r} (known: jinja, deepseek_v4, harmony)")


def build_tokenizer(spec: ModelSpec, assets_dir: Path | None = None) -> tuple[Tokenizer, ResolvedAsset]:
    asset_spec = spec.assets["tokenizer"]
    asset = resolve_asset(spec.id, spec.hub_repo, asset_spec, assets_dir)
    kind = asset_spec.kind
    # Every tokenizer is wrapped: each distinct string is tokenized once, and text between added tokens once where
    # its configuration proves that equals whole-string tokenization (engine.tokenize.SegmentCachedTokenizer).
    if kind == "tokenizer.json":
        name = f"{spec.id} tokenizer.json ({asset.sha256[:12]})"
        return segment_cached_hf(load_hf_tokenizer(asset.data, asset.sha256), name,
                                 all_special_tokens=listed_special_tokens(spec)), asset
    if kind == "o200k_harmony":
        from engine.tiktoken_tokenizer import load_o200k_harmony

        return segment_cached_tiktoken(load_o200k_harmony()), asset
    if kind == "tiktoken.model":
        from engine.tiktoken_tokenizer import load_kimi

        assert asset.path is not None
        return segment_cached_tiktoken(load_kimi(asset.path)), asset
    raise ExplorerError(f"model {spec.id}: unknown tokenizer kind {kind!r}")


@cache
def load_model(model_id: str, renderer: str | None = None, assets_dir: Path | None = None) -> LoadedModel:
    """The model's real renderer and tokenizer; a missing tokenizer is recorded, not raised."""
    spec = load_spec(model_id)
    kind = renderer or spec.renderer
    render, render_asset = build_renderer(spec, kind, assets_dir)
    # Each distinct request rendered once (engine/render/cache.py), and a template's texts kept across runs
    render = CachedRenderer(render, store=PersistedRenders())
    hashes = {render_asset.name: render_asset.sha256}
    sources = {render_asset.name: render_asset.source}
    tokenizer: Tokenizer | None = None
    unavailable: str | None = None
    try:
        tokenizer, tok_asset = build_tokenizer(spec, assets_dir)
        hashes[tok_asset.name] = tok_asset.sha256
        sources[tok_asset.name] = tok_asset.source
    except AssetError as err:
        if spec.assets["tokenizer"].package:
            raise
        unavailable = (
            f"tokenizer unavailable for {spec.id}: {spec.assets['tokenizer'].hub_file} is not shipped by any "
            f"package here; put the Hub file ({spec.hub_repo}) in $DRIFT_ASSETS_DIR/{spec.id}/ or upload it to "
            f"get token-level results ({err})"
        )
    # A loaded model lives as long as the process (this cache never evicts): its objects, and the modules imported to
    # load it, leave the collector's generations. A full collection otherwise re-scans them all (about 200,000
    # objects with the default models), about 0.1 s, once per matrix run.
    gc.freeze()
    return LoadedModel(spec, render, tokenizer, unavailable, hashes, sources)


def preload_models(model_ids: Iterable[str], threads: int = 2) -> None:
    """Load the models two at a time: a tokenizer parses its tokenizer.json (a second or so each) with the GIL
    released, so on two cores two models load in about the time of one. A model that cannot load is left for
    `load_model` to raise, with its sentence, where it is used."""
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="preload") as pool:
        for loading in [pool.submit(load_model, model_id) for model_id in dict.fromkeys(model_ids)]:
            loading.exception()
