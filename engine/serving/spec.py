"""An engine column as the user names it, parsed once where the name comes in (a CLI argument, a link's query string,
an evidence or replay file, a trace replay) and passed typed after.

    raw  bridge  renderers  renderers@0.1.12          the columns that are not a serving engine
    vllm  sglang                                      the newest pinned release (an emulation)
    vllm@0.16.0  sglang@0.5.12                        one release: the pinned ones are emulated, the others run real
    real:vllm@0.33.0                                  a pinned release's own code instead of its emulation
    vllm@0.31.0/qwen3+hermes  sglang@0.5.15/-+llama3  a parser pair by the engine's CLI names (`-`: none)

The layers between the model and the cache, after the release (issue 27):

    raw@minijinja  raw@hfjs  vllm+minijinja           the template rendered by another Jinja runtime (one at most)
    vllm+litellm  vllm+litellm@1.104.9  raw+langchain-openai
                                                      a proxy or client profile between the client and the engine,
                                                      client side first (any number)
    sglang@0.5.23[strip-thinking-cache]               a server flag, as the engine's CLI spells it without `--`
    vllm@0.33.0[default-chat-template-kwargs={"preserve_thinking":true}]
                                                      a flag's value after `=`; flags separated by `,`

    full form: [real:]KIND[@VERSION][[FLAG,...]][/REASONING+TOOL][+LAYER...]   (raw: raw[@RUNTIME][+PROXY...])

`str(spec)` gives the canonical name back, the form the JSON, links and caches carry (the runtime before the proxies,
a flag's JSON value compact with sorted keys). Only the form is checked here (no network, no file): a version is a
release version string before it is ever part of a path or a request; engine.serving.registry.known_engine says
whether the release, the proxy and the profile exist.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
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
# The template runtimes a column can render with instead of transformers' Jinja (engine/render/runtimes.py).
RUNTIMES = ("minijinja", "hfjs")
# A proxy or client profile: `litellm`, `litellm@1.104.9`, `langchain-openai` (engine/serving/layers.py lists them).
_LAYER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")
# The server flags a column can name, by the engine's CLI spelling: the engines that have it, and whether it takes a
# value (a JSON object of template kwargs).
FLAGS: dict[str, tuple[tuple[str, ...], bool]] = {
    "strip-thinking-cache": (("sglang",), False),
    "default-chat-template-kwargs": (("vllm", "sglang"), True),
}


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


def _outside_strings(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth after it) for each character from `start` on outside JSON strings."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
            continue
        if char == '"':
            in_string = True
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        yield index, char, depth


def _closing(text: str, start: int) -> int:
    """The index of the `]` that closes the `[` at `start` (JSON strings and nested brackets skipped), else -1."""
    for index, char, depth in _outside_strings(text, start):
        if char in "]}" and depth == 0:
            return index if char == "]" else -1
    return -1


def split_names(text: str) -> list[str]:
    """A comma-separated list of engine names, split at the commas outside a name's server flags."""
    return _top_level_split(text)


def _top_level_split(text: str) -> list[str]:
    """`text` split at the commas outside JSON strings, brackets and braces."""
    parts, begin = [], 0
    for index, char, depth in _outside_strings(text):
        if char == "," and depth == 0:
            parts.append(text[begin:index])
            begin = index + 1
    return [*parts, text[begin:]]


@dataclass(frozen=True)
class EngineFlag:
    """A server flag by the engine's CLI name (without `--`) and, for one that takes it, its value as compact JSON."""

    name: str
    value: str | None = None

    @classmethod
    def parse(cls, text: str, *, kind: str, engine: str) -> EngineFlag:
        name, equals, value = text.partition("=")
        shown = _shown(engine)
        if name not in FLAGS:
            raise EngineSpecError(f"engine {shown}: unknown server flag {_shown(name)}; known: {', '.join(FLAGS)}")
        kinds, takes_value = FLAGS[name]
        if kind not in kinds:
            raise EngineSpecError(f"engine {shown}: {name} is a flag of {' and '.join(kinds)}, not of {kind}")
        if takes_value != bool(equals):
            raise EngineSpecError(f"engine {shown}: {name} " + (
                "takes a JSON object after = (such as {\"enable_thinking\":false})" if takes_value else
                "takes no value"))
        if not takes_value:
            return cls(name)
        try:
            loaded = json.loads(value)
        except (ValueError, RecursionError):
            loaded = None
        if not isinstance(loaded, dict):
            raise EngineSpecError(f"engine {shown}: the value of {name} is not a JSON object ({_shown(value)})")
        return cls(name, json.dumps(loaded, sort_keys=True, separators=(",", ":"), ensure_ascii=False))

    def json_value(self) -> dict:
        return json.loads(self.value) if self.value is not None else {}

    def __str__(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value}"


def _split_layers(text: str, engine: str) -> tuple[str | None, tuple[str, ...]]:
    """The runtime (one at most) and the proxies, client side first, among `+`-separated layer names."""
    runtime: str | None = None
    proxies: list[str] = []
    for layer in text.split("+"):
        if layer in RUNTIMES:
            if runtime is not None:
                raise EngineSpecError(f"engine {_shown(engine)}: one template runtime per column ({runtime} and "
                                      f"{layer} both named)")
            runtime = layer
            continue
        name, at, version = layer.partition("@")
        if not _LAYER_NAME.fullmatch(name) or (at and not _VERSION.fullmatch(version)):
            raise EngineSpecError(f"engine {_shown(engine)}: {_shown(layer)} is not a layer (a template runtime: "
                                  f"{', '.join(RUNTIMES)}; a proxy or client profile such as litellm or "
                                  "litellm@1.104.9)")
        proxies.append(layer)
    return runtime, tuple(proxies)


@dataclass(frozen=True)
class EngineSpec:
    """One engine column: which engine, which release (None: the pinned default) and which parser pair (None: the
    model's own, from its manifest); and the layers around it: the template runtime, the proxies between the client
    and the engine (client side first) and the server flags."""

    kind: EngineKind
    version: str | None = None
    parsers: ParserPair | None = None
    real_code: bool = False  # `real:`: the release's own code even where an emulation of it is pinned
    runtime: str | None = None  # None: the template rendered as transformers renders it (or the engine's own renderer)
    proxies: tuple[str, ...] = ()
    flags: tuple[EngineFlag, ...] = ()

    def __post_init__(self) -> None:
        # Built directly (from a page's release picker, a cell's fields) it holds what parse would let through.
        if self.kind not in KINDS or (self.version is not None and not _VERSION.fullmatch(self.version)):
            raise EngineSpecError(f"no engine {self.kind!r} at release {self.version!r}")
        if self.runtime is not None and self.runtime not in RUNTIMES:
            raise EngineSpecError(f"no template runtime {self.runtime!r}; known: {', '.join(RUNTIMES)}")

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
        cut = next((i for i, char in enumerate(rest) if char in "[/+"), len(rest))
        release, after, flags_text = rest[:cut], rest[cut:], None
        if after.startswith("["):
            end = _closing(after, 0)
            if end < 0:
                raise EngineSpecError(f"engine {_shown(text)}: the server flags' [ is not closed")
            flags_text, after = after[1:end], after[end + 1:]
        if after and after[0] not in "/+":
            raise EngineSpecError(f"engine {_shown(text)}: after the server flags comes /REASONING+TOOL or +LAYER")
        slash = after.startswith("/")
        pair_text, layers_text = "", ""
        if slash:
            pieces = after[1:].split("+")
            pair_text, layers_text = "+".join(pieces[:2]), "+".join(pieces[2:])
        elif after:
            layers_text = after[1:]
        kind, at, version = release.partition("@")
        if kind == "raw" and at and version in RUNTIMES:  # raw@minijinja: the runtime is raw's only "version"
            at, version, layers_text = "", "", "+".join(filter(None, (version, layers_text)))
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
        runtime, proxies = _split_layers(layers_text, text) if layers_text or after.startswith("+") else (None, ())
        if kind not in SERVING_KINDS:
            if real_code or slash or flags_text is not None or (at and kind != "renderers"):
                raise EngineSpecError(f"engine {_shown(text)}: {kind} takes "
                                      f"{'a release version only' if kind == 'renderers' else 'no release'}; "
                                      "real:, server flags and a parser pair name a vLLM or SGLang release")
            if kind != "raw" and (runtime or proxies):
                raise EngineSpecError(f"engine {_shown(text)}: {kind} takes no layers (a runtime or a proxy goes on "
                                      "raw, vllm or sglang)")
            return cls(kind, version if at else None, runtime=runtime, proxies=proxies)
        if real_code and not at:
            raise EngineSpecError(f"engine {_shown(text)}: real: names one release (real:{kind}@0.16.0)")
        flags: list[EngineFlag] = []
        for flag_text in _top_level_split(flags_text) if flags_text else ():
            flag = EngineFlag.parse(flag_text, kind=kind, engine=text)
            if any(f.name == flag.name for f in flags):
                raise EngineSpecError(f"engine {_shown(text)}: the flag {flag.name} is named twice")
            flags.append(flag)
        if flags_text is not None and not flags:
            raise EngineSpecError(f"engine {_shown(text)}: [] names no server flag")
        pair = ParserPair.parse(pair_text, engine=text) if slash else None
        return cls(kind, version if at else None, pair, real_code, runtime, proxies, tuple(flags))

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
        """The release alone: `vllm@0.16.0`, `vllm` (the pinned default), without real:, flags, the parser pair and
        the layers."""
        return f"{self.kind}@{self.version}" if self.version is not None else self.kind

    @property
    def has_layers(self) -> bool:
        """Whether the column names a runtime, a proxy or a server flag (issue 27's layers)."""
        return bool(self.runtime or self.proxies or self.flags)

    def flag(self, name: str) -> EngineFlag | None:
        return next((f for f in self.flags if f.name == name), None)

    def __str__(self) -> str:
        flags = f"[{','.join(map(str, self.flags))}]" if self.flags else ""
        if self.kind == "raw":
            head, layers = "raw" + (f"@{self.runtime}" if self.runtime else ""), self.proxies
        else:
            head = f"{self.release}{flags}{f'/{self.parsers}' if self.parsers else ''}"
            layers = ((self.runtime,) if self.runtime else ()) + self.proxies
        return f"{'real:' if self.real_code else ''}{head}{''.join(f'+{layer}' for layer in layers)}"
