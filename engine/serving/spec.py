"""An engine column as the user names it, parsed once where the name comes in (a CLI argument, a link's query string,
an evidence or replay file, a trace replay) and passed typed after.

    raw  bridge  renderers  renderers@0.1.12          the columns that are not a serving engine
    vllm  sglang                                      the newest pinned release (an emulation)
    vllm@0.16.0  sglang@0.5.12                        one release: the pinned ones are emulated, the others run real
    real:vllm@0.33.0                                  a pinned release's own code instead of its emulation
    vllm@0.31.0/qwen3+hermes  sglang@0.5.15/-+llama3  a parser pair by the engine's CLI names (`-`: none)

`str(spec)` gives the canonical name back, the form the JSON, links and caches carry. Only the form is checked here
(no network, no file): a version is a release version string before it is ever part of a path or a request;
engine.serving.registry.known_engine says whether the release exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from engine.errors import EngineSpecError, UnknownEngineKind
from engine.serving.real.fetch import release_name_problem

EngineKind = Literal["vllm", "sglang", "raw", "bridge", "renderers"]
KINDS: tuple[EngineKind, ...] = get_args(EngineKind)
SERVING_KINDS = ("vllm", "sglang")  # the engines with releases, parsers and a request side

# A release version as PyPI spells it (PEP 440's public form: 0.16.0, 0.5.0rc1, 1.0.post1, 0.11.0.dev2): no path
# separator, no `..`, no escape, no space can pass, so a version is safe in a cache path and a package index URL.
_VERSION = re.compile(r"\d{1,6}(?:\.\d{1,6}){0,5}(?:(?:a|b|rc)\d{1,6})?(?:\.post\d{1,6})?(?:\.dev\d{1,6})?")
_PARSER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # an engine CLI name: qwen3_coder, deepseekv4, gpt-oss
_MAX_LENGTH = 200
NO_PARSER = "-"


def _shown(text: str) -> str:
    return repr(text[:60]) + ("…" if len(text) > 60 else "")


@dataclass(frozen=True)
class ParserPair:
    """The reasoning and tool-call parsers a server is started with, by the engine's CLI names (None: none)."""

    reasoning_parser: str | None
    tool_call_parser: str | None

    @classmethod
    def parse(cls, text: str, *, engine: str = "") -> ParserPair:
        """`REASONING+TOOL` by the engine's CLI names (`-` or nothing: none); `engine`: the whole name, for the
        sentence of an EngineSpecError."""
        reasoning, plus, tool = text.partition("+")
        shown = _shown(engine or text)
        if not plus:
            raise EngineSpecError(f"engine {shown}: name the parser pair as RELEASE/REASONING+TOOL (- for none)")
        names = []
        for name in (reasoning, tool):
            if name not in ("", NO_PARSER) and not _PARSER_NAME.fullmatch(name):
                raise EngineSpecError(f"engine {shown}: {_shown(name)} is not a parser name (the engine's CLI "
                                      "name, such as qwen3 or qwen3_coder)")
            names.append(None if name in ("", NO_PARSER) else name)
        return cls(names[0], names[1])

    def as_override(self) -> dict[str, str | None]:
        """As a model manifest's engine_parsers entry names them."""
        return {"reasoning_parser": self.reasoning_parser, "tool_call_parser": self.tool_call_parser}

    def __str__(self) -> str:
        return f"{self.reasoning_parser or NO_PARSER}+{self.tool_call_parser or NO_PARSER}"


@dataclass(frozen=True)
class EngineSpec:
    """One engine column: which engine, which release (None: the pinned default) and which parser pair (None: the
    model's own, from its manifest)."""

    kind: EngineKind
    version: str | None = None
    parsers: ParserPair | None = None
    real_code: bool = False  # `real:`: the release's own code even where an emulation of it is pinned

    def __post_init__(self) -> None:
        # Built directly (from a page's release picker, a cell's fields) it holds what parse would let through.
        if self.kind not in KINDS or (self.version is not None and not _VERSION.fullmatch(self.version)):
            raise EngineSpecError(f"no engine {self.kind!r} at release {self.version!r}")

    @classmethod
    def parse(cls, text: object) -> EngineSpec:
        """The spec `text` names; EngineSpecError in one sentence when it names none."""
        if not isinstance(text, str):
            raise UnknownEngineKind(f"unknown engine of type {type(text).__name__}; an engine is named by a string "
                                    "such as vllm, sglang@0.5.12, raw, bridge or renderers")
        if len(text) > _MAX_LENGTH:
            raise EngineSpecError(f"unknown engine {_shown(text)}: an engine name is at most {_MAX_LENGTH} "
                                  f"characters, this one has {len(text)}")
        rest, real_code = (text[len("real:"):], True) if text.startswith("real:") else (text, False)
        release, slash, pair_text = rest.partition("/")
        kind, at, version = release.partition("@")
        # First: a version may end up in a path or a URL. A vLLM or SGLang release by the rule the fetch layer
        # applies before it touches the cache or PyPI (one rule, one sentence); any other version by its shape.
        problem = release_name_problem(kind, version) if at and kind in SERVING_KINDS else None
        if problem is not None:
            raise EngineSpecError(problem)
        if at and not _VERSION.fullmatch(version):
            raise EngineSpecError(f"engine {_shown(text)}: {_shown(version)} is not a release version (digits and "
                                  "dots, such as 0.16.0 or 0.5.0rc1)")
        if kind not in KINDS:
            raise UnknownEngineKind(f"unknown engine {_shown(text)}; known: {', '.join(KINDS)}, each of vllm, sglang "
                                    "and renderers with a release (vllm@0.16.0)")
        if kind not in SERVING_KINDS:
            if real_code or slash or (at and kind != "renderers"):
                raise EngineSpecError(f"engine {_shown(text)}: {kind} takes "
                                      f"{'a release version only' if kind == 'renderers' else 'no release'}; "
                                      "real: and a parser pair name a vLLM or SGLang release")
            return cls(kind, version if at else None)
        if real_code and not at:
            raise EngineSpecError(f"engine {_shown(text)}: real: names one release (real:{kind}@0.16.0)")
        pair = ParserPair.parse(pair_text, engine=text) if slash else None
        return cls(kind, version if at else None, pair, real_code)

    @classmethod
    def of(cls, engine: EngineSpec | str) -> EngineSpec:
        """`engine` typed: the library's entry points take a spec or its name (tests and scripts pass names)."""
        return engine if isinstance(engine, EngineSpec) else cls.parse(engine)

    @property
    def is_serving_engine(self) -> bool:
        """vLLM or SGLang: an engine with releases, parsers and a request side (not raw, bridge or renderers)."""
        return self.kind in SERVING_KINDS

    @property
    def release(self) -> str:
        """The release alone: `vllm@0.16.0`, `vllm` (the pinned default), without real: and the parser pair."""
        return f"{self.kind}@{self.version}" if self.version is not None else self.kind

    def __str__(self) -> str:
        return f"{'real:' if self.real_code else ''}{self.release}{f'/{self.parsers}' if self.parsers else ''}"

