"""Validation of every uploaded file before anything uses it; each failure is one sentence naming the file.

A user uploads, for one base model (whose output format, engine parsers and defaults the upload borrows), any of
these roles:

| role | file | size cap (env var) |
|---|---|---|
| `chat_template` | a Jinja chat template (`.jinja`) | 5 MB (`DRIFT_UPLOAD_MAX_TEXT_BYTES`) |
| `tokenizer_config` | `tokenizer_config.json` (its `chat_template` and special tokens) | 5 MB (same) |
| `tokenizer` | `tokenizer.json` (Hugging Face `tokenizers`) | 50 MB (`DRIFT_UPLOAD_MAX_TOKENIZER_BYTES`) |
| `tiktoken` | Kimi's `tiktoken.model` (only for a base model that uses one) | 50 MB (same) |

The caps are far above real files (chat templates are tens of KB, the largest Hub tokenizer.json files about
35 MB) and refuse a file before it is decoded or parsed. What `validate_upload` checks, in this order:

1. sizes (before anything is decoded), roles, and that the base model exists;
2. UTF-8 (with the byte offset of the first bad byte) and no NUL bytes in text files;
3. `tokenizer_config.json`: a JSON object; `chat_template` is a string or a list of `{name, template}` (the one
   named "default" is used); `*_token` entries are strings or `{"content": ...}` (booleans and numbers such as
   `add_bos_token: true` are settings and are skipped); `added_tokens_decoder` maps ids to `{"content": ...}`;
4. Jinja syntax, compiled in the sandbox (engine/sandbox.py), with the line and column of the error;
5. that the template renders the base model's basic conversation (the first request of scenario `tool-call`)
   within the render limits, to a non-empty prompt, and then every request of every scenario within the render
   limits and `DRIFT_UPLOAD_CHECK_BUDGET_S` (30 s) in all: a template that hits a limit on any of them (one that
   loops only on later turns) is refused, so no matrix view ever waits on it;
6. `tokenizer.json` (JSON object with `model.type` and an `added_tokens` list, loads with `tokenizers`) or
   `tiktoken.model` (`<base64> <rank>` lines, distinct contiguous ranks, Kimi's rank count), each loaded in a
   fresh worker under `DRIFT_UPLOAD_LOAD_TIMEOUT_S` (60 s) and `DRIFT_UPLOAD_LOAD_MEMORY_MB` (3072 MB);
7. that every special token the template emits in that conversation (`<|im_start|>`, `<think>`, ...) is one
   token in the uploaded tokenizer, or, with no tokenizer uploaded, in the base model's (a Llama 3.1 template
   for qwen3.5 is refused: its `<|start_header_id|>` would be seven ordinary Qwen tokens).

When both a `.jinja` and a `tokenizer_config.json` with a `chat_template` are uploaded, the `.jinja` wins, as in
transformers. API: `UploadLimits`, `UploadError`, `read_capped`, `validate_upload` -> `ValidatedUpload`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, BinaryIO

from engine.errors import ExplorerError, RenderError

if TYPE_CHECKING:
    from engine.models import ModelSpec
    from engine.sandbox import RenderLimits
    from engine.tokenize import Tokenizer

ROLES: dict[str, str] = {
    "chat_template": "a chat template",
    "tokenizer_config": "a tokenizer_config.json",
    "tokenizer": "a tokenizer.json",
    "tiktoken": "a tiktoken.model",
}
TEXT_ROLES = ("chat_template", "tokenizer_config")
PROBE_SCENARIO = "tool-call"
_MB = 1024 * 1024


class UploadError(ExplorerError):
    """An uploaded file was refused; `str(err)` is one sentence naming the file and the problem."""


@dataclass(frozen=True)
class UploadLimits:
    """Size caps and the bounds for loading tokenizer files (see the module docstring for the env vars)."""

    max_text_bytes: int = 5 * _MB
    max_tokenizer_bytes: int = 50 * _MB
    load_timeout_s: float = 60.0
    load_memory_mb: int = 3072
    check_budget_s: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ExplorerError(f"upload limit {f.name} must be a positive number, got {value!r}")

    @classmethod
    def from_env(cls) -> UploadLimits:
        """The defaults, overridden by DRIFT_UPLOAD_MAX_TEXT_BYTES, _MAX_TOKENIZER_BYTES, _LOAD_TIMEOUT_S, ..."""
        from engine.sandbox import env_overrides

        return cls(**env_overrides(cls, "DRIFT_UPLOAD_"))

    def cap(self, role: str) -> int:
        return self.max_text_bytes if role in TEXT_ROLES else self.max_tokenizer_bytes

    @staticmethod
    def cap_setting(role: str) -> str:
        return "DRIFT_UPLOAD_MAX_TEXT_BYTES" if role in TEXT_ROLES else "DRIFT_UPLOAD_MAX_TOKENIZER_BYTES"


@dataclass(frozen=True)
class ValidatedFile:
    role: str
    name: str  # the original file name, as the user knows it
    sha256: str
    size: int


@dataclass(frozen=True)
class ValidatedUpload:
    """Everything a stored upload needs, proven usable."""

    base_model: str
    files: tuple[ValidatedFile, ...]
    template_source: str | None  # the template that renders (the .jinja, or the config's); None: the base's
    template_name: str | None  # the file its errors name
    special_tokens: dict[str, str]  # template variables (bos_token, ...): the base model's, then the config's
    probe_prompt: str  # the basic conversation as it renders


def read_capped(stream: BinaryIO, name: str, role: str, limits: UploadLimits | None = None) -> bytes:
    """Read an upload from a binary stream, refusing it as soon as it passes the role's cap (never read whole)."""
    limits = limits or UploadLimits.from_env()
    cap = limits.cap(role)
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise UploadError(f"{name} is larger than the {_size(cap)} limit for {ROLES.get(role, role)} "
                          f"({limits.cap_setting(role)})")
    return data


def read_path(path: str | os.PathLike, what: str, cap: int, setting: str) -> bytes:
    """A file named on the command line, read as an upload is: refused past `cap` bytes without reading it whole
    (so `/dev/zero` or a huge file is one sentence), or when it is a folder or cannot be opened."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(cap + 1)
    except IsADirectoryError:
        raise UploadError(f"{path} is a folder, not {what}") from None
    except OSError as err:
        raise UploadError(f"{path} cannot be read as {what} ({err.strerror or err})") from None
    if len(data) > cap:
        raise UploadError(f"{path} is larger than the {_size(cap)} limit for {what} ({setting})")
    return data


def validate_upload(base_model: str, files: dict[str, tuple[str, bytes]], *, limits: UploadLimits | None = None,
                    render_limits: RenderLimits | None = None) -> ValidatedUpload:
    """Check every file of one upload (role -> (original name, bytes)); raise UploadError on the first problem."""
    from engine.models import load_model, load_spec, model_ids, special_token_vars

    limits = limits or UploadLimits.from_env()
    try:
        spec = load_spec(base_model)
    except ExplorerError:
        raise UploadError(f"unknown base model {base_model!r}; known: {', '.join(model_ids())}") from None
    if not files:
        raise UploadError(f"the upload for {base_model} holds no files")
    checked: list[ValidatedFile] = []
    for role, entry in files.items():
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], bytes | bytearray)):
            raise UploadError(f"the upload's {role!r} entry must be (file name, bytes)")
        name, data = entry
        if role not in ROLES:
            raise UploadError(f"{name}: unknown upload role {role!r}; expected one of {', '.join(ROLES)}")
        _check_size(name, role, len(data), limits)
        checked.append(ValidatedFile(role, name, hashlib.sha256(data).hexdigest(), len(data)))
    if "tokenizer" in files and "tiktoken" in files:
        raise UploadError(f"{files['tokenizer'][0]} and {files['tiktoken'][0]}: upload one tokenizer, not two")
    tokenizer_kind = spec.assets["tokenizer"].kind if "tokenizer" in spec.assets else ""
    if "tiktoken" in files and tokenizer_kind != "tiktoken.model":
        raise UploadError(f"{files['tiktoken'][0]}: a tiktoken.model only fits a base model whose tokenizer is one "
                          f"(kimi-k2.6), not {base_model}")

    special_tokens = special_token_vars(spec)
    template_source: str | None = None
    template_name: str | None = None
    if "tokenizer_config" in files:
        name, data = files["tokenizer_config"]
        config_template, config_tokens = parse_tokenizer_config(bytes(data), name)
        special_tokens.update(config_tokens)
        if config_template is not None:
            template_source, template_name = config_template, f"{name} (chat_template)"
    if "chat_template" in files:
        name, data = files["chat_template"]
        template_source, template_name = decode_text(bytes(data), name), name

    prompt = probe_prompt(base_model, spec, template_source, template_name, special_tokens, render_limits)
    if template_source is not None and template_name is not None:
        _render_every_scenario(base_model, template_source, template_name, special_tokens, render_limits, limits)
    if "tokenizer" in files or "tiktoken" in files:
        role = "tokenizer" if "tokenizer" in files else "tiktoken"
        name, data = files[role]
        probes = special_token_candidates(prompt, spec.special_tokens, special_tokens,
                                          load_model(base_model).tokenizer)
        function = "inspect_tokenizer_json" if role == "tokenizer" else "inspect_tiktoken_model"
        report = _bounded_inspect(function, bytes(data), name, probes, prompt, limits)
        missing = [p for p in probes if report["single"].get(p) is None]
        if missing:
            emitter = template_name or f"the {base_model} template"
            raise UploadError(f"{name} has no single token for {missing[0]!r}, which {emitter} emits in the first "
                              f"request of scenario {PROBE_SCENARIO}: the tokenizer does not match the template"
                              + (f" (also missing: {', '.join(map(repr, missing[1:4]))})" if missing[1:] else ""))
    elif template_source is not None and (base_tokenizer := load_model(base_model).tokenizer) is not None:
        # The upload renders with the base model's tokenizer: a marker it splits is text, not a special token.
        probes = special_token_candidates(prompt, spec.special_tokens, special_tokens, base_tokenizer)
        split = {p: len(base_tokenizer.encode(p).ids) for p in probes}
        missing = [p for p, count in split.items() if count != 1]
        if missing:
            raise UploadError(f"{template_name} emits {missing[0]!r} in the first request of scenario "
                              f"{PROBE_SCENARIO}, which the {base_model} tokenizer splits into {split[missing[0]]} "
                              "ordinary tokens: the template is not for this tokenizer (upload the tokenizer.json "
                              "it belongs to, or pick its base model)"
                              + (f" (also split: {', '.join(map(repr, missing[1:4]))})" if missing[1:] else ""))
    return ValidatedUpload(base_model, tuple(checked), template_source, template_name, special_tokens, prompt)


def _check_size(name: str, role: str, size: int, limits: UploadLimits) -> None:
    if size == 0:
        raise UploadError(f"{name} is empty")
    cap = limits.cap(role)
    if size > cap:
        raise UploadError(f"{name} is {_size(size)}, over the {_size(cap)} limit for {ROLES[role]} "
                          f"({limits.cap_setting(role)})")


def _size(size: int) -> str:
    return f"{size / _MB:.1f} MB" if size >= _MB / 10 else f"{size:,} bytes"


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 text, or UploadError naming the byte offset of the first byte that is not UTF-8 (or a NUL byte)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UploadError(f"{name} is not UTF-8 text: byte 0x{data[err.start]:02x} at byte offset {err.start} "
                          f"cannot be decoded ({err.reason})") from None
    if text.startswith("\ufeff"):
        raise UploadError(f"{name} starts with a byte-order mark (U+FEFF), which would become the first character "
                          "of every prompt: save it as UTF-8 without a BOM")
    nul = text.find("\x00")
    if nul >= 0:
        raise UploadError(f"{name} contains a NUL byte at byte offset {len(text[:nul].encode('utf-8'))}: it is a "
                          "binary file, not text")
    return text


def json_document(data: bytes, name: str) -> Any:
    """UTF-8 JSON (decode_text's checks), or UploadError naming the file, the line and column."""
    text = decode_text(data, name)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UploadError(f"{name} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise UploadError(f"{name} is not usable JSON: it is nested too deeply") from None


def parse_tokenizer_config(data: bytes, name: str) -> tuple[str | None, dict[str, str]]:
    """(the chat template or None, the special-token template variables) of a tokenizer_config.json."""
    config = json_document(data, name)
    if not isinstance(config, dict):
        raise UploadError(f"{name} must be a JSON object, not {_json_kind(config)}")
    template = config.get("chat_template")
    if isinstance(template, list):
        named: dict[str, str] = {}
        for index, entry in enumerate(template):
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise UploadError(f"{name}: chat_template[{index}] must be an object with string 'name' and "
                                  "'template'")
            named[entry["name"]] = entry["template"]
        if "default" not in named:
            raise UploadError(f"{name}: chat_template has no template named 'default' (it has: "
                              f"{', '.join(map(repr, named)) or 'none'})")
        template = named["default"]
    elif template is not None and not isinstance(template, str):
        raise UploadError(f"{name}: chat_template must be a string or a list of {{name, template}} objects, not "
                          f"{_json_kind(template)}")
    decoder = config.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            raise UploadError(f"{name}: added_tokens_decoder must be an object of token id -> token, not "
                              f"{_json_kind(decoder)}")
        for token_id, token in decoder.items():
            if not (token_id.isdigit() and isinstance(token, dict) and isinstance(token.get("content"), str)):
                raise UploadError(f"{name}: added_tokens_decoder[{token_id!r}] must map a numeric id to an object "
                                  "with a string 'content'")
    tokens: dict[str, str] = {}
    for key, value in config.items():
        # Hub configs hold flags under the same suffix (add_bos_token: true, split_special_tokens: false): a
        # boolean or a number is a setting, not a token, and transformers passes no such key to the template.
        if not key.endswith("_token") or value is None or isinstance(value, bool | int | float):
            continue
        content = value.get("content") if isinstance(value, dict) else value
        if not isinstance(content, str):
            raise UploadError(f"{name}: {key} must be a string or an object with a string 'content', not "
                              f"{_json_kind(value)}")
        tokens[key] = content
    return template, tokens


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def probe_prompt(base_model: str, spec: ModelSpec, source: str | None, name: str | None,
                 special_tokens: dict[str, str], render_limits: RenderLimits | None, *,
                 label: str | None = None, worker: str | None = None) -> str:
    """The first request of the probe scenario (the basic conversation) as the upload's template renders it (the
    base's without one); UploadError, one sentence, when it cannot be rendered or renders nothing. `worker`: the
    sandbox worker to render in (SandboxedRenderer's)."""
    from engine.models import load_model
    from engine.sandbox import RenderLimitExceeded, SandboxedRenderer, TemplateSyntaxProblem
    from engine.scenario import load_scenario

    scenario = load_scenario(PROBE_SCENARIO)
    messages: list[dict] = [{"role": "system", "content": scenario.system}] if scenario.system else []
    for turn in scenario.turns:
        if turn.role == "assistant":
            break
        messages.append({"role": turn.role, "content": turn.text})
    kwargs = {**spec.default_kwargs(), **scenario.kwargs}
    if source is None:
        renderer = load_model(base_model).renderer
        return renderer.render(messages, scenario.tools, add_generation_prompt=True, kwargs=kwargs).text
    assert name is not None
    try:
        renderer = SandboxedRenderer(source, model=label or f"{base_model} (upload)", source_path=name,
                                     special_tokens=special_tokens, limits=render_limits, worker=worker)
        text = renderer.render(messages, scenario.tools, add_generation_prompt=True, kwargs=kwargs).text
    except TemplateSyntaxProblem as err:
        where = f"line {err.source_line}, column {err.column}" if err.column else f"line {err.source_line}"
        raise UploadError(f"{name} does not parse: {err.detail} ({where})") from None
    except RenderLimitExceeded as err:
        raise UploadError(str(err)) from None
    except RenderError as err:
        raise UploadError(f"{err} (rendering the first request of scenario {PROBE_SCENARIO})") from None
    if not text.strip():
        raise UploadError(f"{name} renders an empty prompt for the first request of scenario {PROBE_SCENARIO} "
                          f"(base model {base_model})" + (f": it rendered only {text!r}" if text else ""))
    return text


def _render_every_scenario(base_model: str, source: str, name: str, special_tokens: dict[str, str],
                           render_limits: RenderLimits | None, limits: UploadLimits) -> None:
    """Every request of every scenario, as the matrix renders them (engine raw), within the render limits and the
    validation budget; a template error on a scenario is that cell's result, not a refusal."""
    import dataclasses
    import time

    from engine.models import load_model
    from engine.sandbox import SandboxedRenderer, render_scope
    from engine.scenario import scenario_ids
    from engine.simulate import run_cell_with

    renderer = SandboxedRenderer(source, model=f"{base_model} (upload)", source_path=name,
                                 special_tokens=special_tokens, limits=render_limits)
    model = dataclasses.replace(load_model(base_model), renderer=renderer)
    scenarios = scenario_ids()
    started = time.monotonic()
    with render_scope() as tripped:
        for done, scenario in enumerate(scenarios, start=1):
            run_cell_with(model, scenario, "raw", {}, explain=False)
            if tripped:
                limit = next(iter(tripped.values()))
                raise UploadError(f"{limit} on scenario {scenario}; a template that hits a limit on any scenario "
                                  "is refused, so that no view waits on it")
            elapsed = time.monotonic() - started
            if elapsed > limits.check_budget_s and done < len(scenarios):
                raise UploadError(f"{name} took {elapsed:.1f} s to render {done} of the {len(scenarios)} scenarios, "
                                  f"over the {limits.check_budget_s:g} s budget for validating an upload "
                                  "(DRIFT_UPLOAD_CHECK_BUDGET_S)")


_MARKER = re.compile(r"<\|[^|\s<>]{1,64}\|>|<｜[^｜\s<>]{1,64}｜>")
_MARKER_SHAPED = re.compile(r"<[^<>\s]{1,64}>|\[[^\[\]\s]{1,64}\]")


def special_token_candidates(prompt: str, spec_tokens: dict[str, Any], variables: dict[str, str],
                             base_tokenizer: Tokenizer | None = None) -> list[str]:
    """Special tokens the prompt holds, in the order they first appear: every `<|...|>` / `<｜...｜>` marker, and the
    marker-shaped special tokens of the base model or the config (`<think>`, `[gMASK]`, ...) that the base model's
    own tokenizer, when there is one, holds as a single token (DeepSeek's `<｜DSML｜tool_calls>` is several)."""
    found = {m.group(0) for m in _MARKER.finditer(prompt)}
    named: list[str] = list(variables.values())
    for value in spec_tokens.values():
        named.extend(value if isinstance(value, list) else [value])
    for value in named:
        if not (isinstance(value, str) and _MARKER_SHAPED.fullmatch(value) and value in prompt):
            continue
        if base_tokenizer is None or len(base_tokenizer.encode(value).ids) == 1:
            found.add(value)
    return sorted(found, key=lambda token: (prompt.find(token), token))


def _bounded_inspect(function: str, data: bytes, name: str, probes: list[str], prompt: str,
                     limits: UploadLimits) -> dict:
    from engine.sandbox import RenderLimitExceeded, run_bounded

    try:
        report = run_bounded(f"engine.uploads:{function}", data, name, probes, prompt,
                             timeout_s=limits.load_timeout_s, memory_mb=limits.load_memory_mb, what=name)
    except RenderLimitExceeded as err:
        setting = "DRIFT_UPLOAD_LOAD_TIMEOUT_S" if err.limit == "time" else "DRIFT_UPLOAD_LOAD_MEMORY_MB"
        raise UploadError(f"{err} ({setting})") from None
    except ExplorerError as err:
        raise UploadError(str(err)) from None
    if not isinstance(report, dict) or not isinstance(report.get("single"), dict):
        raise UploadError(f"{name}: the worker that loaded it sent a malformed report")
    return report


# ---- run inside a sandbox worker (engine.sandbox.run_bounded) ----------------------------------------------


def inspect_tokenizer_json(data: bytes, name: str, probes: list[str], sample: str) -> dict:
    """Structure, load and probe of a tokenizer.json: {"single": {probe: id or None}, "vocab_size", ...}."""
    document = json_document(data, name)
    if not isinstance(document, dict):
        raise UploadError(f"{name} must be a JSON object, not {_json_kind(document)}")
    model = document.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("type"), str):
        raise UploadError(f"{name} is not a tokenizer.json: it has no \"model\" object with a \"type\"")
    added = document.get("added_tokens")
    if not isinstance(added, list):
        raise UploadError(f"{name} is not a tokenizer.json: \"added_tokens\" must be a list, not {_json_kind(added)}")
    for index, token in enumerate(added):
        if not (isinstance(token, dict) and isinstance(token.get("id"), int) and isinstance(token.get("content"), str)):
            raise UploadError(f"{name}: added_tokens[{index}] must be an object with an integer \"id\" and a string "
                              "\"content\"")
    del document
    import tokenizers

    try:
        tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # noqa: BLE001 - the library's own reason, in one line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UploadError(f"{name} does not load with tokenizers {tokenizers.__version__}: {reason}") from None
    single = {}
    for probe in probes:
        ids = tokenizer.encode(probe, add_special_tokens=False).ids
        single[probe] = ids[0] if len(ids) == 1 else None
    prompt_tokens = len(tokenizer.encode(sample, add_special_tokens=False).ids)
    return {"single": single, "vocab_size": tokenizer.get_vocab_size(), "prompt_tokens": prompt_tokens}


def inspect_tiktoken_model(data: bytes, name: str, probes: list[str], sample: str) -> dict:
    """Line format, rank table and probe of Kimi's tiktoken.model, loaded as engine.tiktoken_tokenizer loads it."""
    import tempfile
    from pathlib import Path

    from engine.tiktoken_tokenizer import load_kimi

    safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(name)) or "tiktoken.model"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / safe_name
        path.write_bytes(data)
        try:
            tokenizer = load_kimi(path)
        except ExplorerError as err:
            raise UploadError(str(err).replace(str(path), name).replace(safe_name, name)) from None
    single = {}
    for probe in probes:
        ids = tokenizer.encode(probe).ids
        single[probe] = ids[0] if len(ids) == 1 else None
    return {"single": single, "prompt_tokens": len(tokenizer.encode(sample).ids)}
