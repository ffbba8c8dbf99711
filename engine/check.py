"""`python -m engine check`: a template author's CI gate — every scenario through a template file.

The template first renders the basic conversation (the first request of scenario `tool-call`, as an upload must);
a template that fails there is reported once and no scenario is rendered, so a hostile or broken template ends
after one render limit instead of one per scenario. Breaks (PRR does not hold) and errors (the template failed on
a later request, so there is no PRR result) are counted apart.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import ExplorerError
from engine.matrix import cell_json
from engine.models import load_model, special_token_vars
from engine.sandbox import SandboxedRenderer, render_scope
from engine.scenario import scenario_ids
from engine.serving.spec import EngineSpec
from engine.simulate import CellResult, run_cell_with
from engine.uploads import PROBE_SCENARIO, UploadError, probe_prompt

ENGINE_MEANING = {"raw": "the template alone: lossless split of the model output",
                  "bridge": "next prompt appended to the previous token ids"}
WIDTH = 110


@dataclass(frozen=True)
class CheckReport:
    model: str
    template: str
    engine: EngineSpec  # as asked: raw, bridge, vllm, sglang@0.5.12, ...
    engine_version: str
    cells: tuple[CellResult, ...]
    refused: str | None = None  # why the basic conversation failed; then no scenario was rendered

    @property
    def breaks(self) -> int:
        return sum(c.status == "breaks" for c in self.cells)

    @property
    def errors(self) -> int:
        return sum(c.status == "error" for c in self.cells)

    @property
    def failed(self) -> bool:
        return self.refused is not None or self.breaks > 0 or self.errors > 0

    @property
    def engine_label(self) -> str:
        if self.engine.kind in ENGINE_MEANING:
            return f"{self.engine.kind} ({ENGINE_MEANING[self.engine.kind]})"
        return f"{'real:' if self.engine.real_code else ''}{self.engine.kind} {self.engine_version}".strip()

    @property
    def text(self) -> str:
        lines = [f"# {self.template} for {self.model}, engine {self.engine_label}"]
        bypassed = next((c.renderer for c in self.cells if c.renderer and not c.renderer.startswith("template")), None)
        if bypassed:  # e.g. vLLM renders gpt-oss through openai-harmony whatever --chat-template says
            lines.append(_wrap(f"note: this engine renders {self.model} with {bypassed}, not with the template",
                               "", " " * 6))
        if self.refused is not None:
            lines.append(_wrap(f"error: {self.refused}", "", " " * 7))
            lines.append(f"the template fails the basic conversation (first request of scenario {PROBE_SCENARIO}); "
                         f"none of the {len(scenario_ids())} scenarios was rendered")
            return "\n".join(lines)
        for c in self.cells:
            lines.append(f"{c.status:<11} {c.scenario}")
            if c.cause:
                lines.append(_wrap(f"{c.cause.stage} {c.cause.location}: {c.cause.detail}", " " * 12, " " * 12))
            if c.status in ("error", "unavailable") and c.note:
                lines.append(_wrap(c.note, " " * 12, " " * 12))
        lines.append(f"{len(self.cells)} scenarios: {self.breaks} break PRR, {self.errors} "
                     f"{'error' if self.errors == 1 else 'errors'} (the template failed to render: no PRR result), "
                     f"{sum(c.status == 'holds' for c in self.cells)} hold"
                     + (f", {unavailable} unavailable (the scenario does not apply; see above)"
                        if (unavailable := sum(c.status == 'unavailable' for c in self.cells)) else ""))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"model": self.model, "template": self.template, "engine": str(self.engine),
                "engine_version": self.engine_version, "refused": self.refused,
                "breaks": self.breaks, "errors": self.errors,
                "holds": sum(c.status == "holds" for c in self.cells),
                "unavailable": sum(c.status == "unavailable" for c in self.cells),
                "cells": [cell_json(c) for c in self.cells]}


def _wrap(text: str, first: str, rest: str) -> str:
    """Whole words on each line, every word kept (never cut mid-word, nothing dropped)."""
    return textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False)


def check_template(model_id: str, template: Path, engine: EngineSpec | str = "raw",
                   scenarios: Sequence[str] | None = None) -> CheckReport:
    """Every scenario (or those named) through `template` as `model_id`'s chat template."""
    from engine.scenario import load_scenario
    from engine.uploads import UploadLimits, decode_text, read_path

    engine = EngineSpec.of(engine)  # the CLI passes it parsed; a script may name it
    chosen = list(scenarios) if scenarios is not None else scenario_ids()
    for scenario_id in chosen:
        load_scenario(scenario_id)  # an unknown one is one sentence before any render

    limits = UploadLimits.from_env()
    # Read as an upload is: under its size cap, UTF-8 without NUL bytes or a BOM, not empty.
    source = decode_text(read_path(template, "a chat template", limits.max_text_bytes,
                                   limits.cap_setting("chat_template")), str(template))
    if not source.strip():
        raise ExplorerError(f"{template} is empty" + (" (only whitespace)" if source else ""))
    stock = load_model(model_id)
    special_tokens = special_token_vars(stock.spec)
    try:
        probe_prompt(model_id, stock.spec, source, template.name, special_tokens, None, label=f"{model_id} (custom)")
    except UploadError as err:
        return CheckReport(model_id, template.name, engine, "", (), str(err))
    # A template under test is someone else's code: it renders in the sandbox, with the base model's token variables.
    renderer = SandboxedRenderer(source, model=f"{model_id} (custom)", source_path=template.name,
                                 special_tokens=special_tokens)
    model = replace(stock, renderer=renderer)
    # One scope: a template that hits the time limit on one scenario is not rendered again on the others.
    with render_scope():
        cells = tuple(run_cell_with(model, s, engine, {}) for s in chosen)
    return CheckReport(model_id, template.name, engine, cells[0].engine_version if cells else "", cells)


# ---- CI faces: GitHub workflow annotations and SARIF -----------------------------------------------------------

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_URI = "https://github.com/drift-matrix/drift-matrix-explorer"
RENDER_ERROR, REFUSED = "render-error", "basic-conversation-refused"


@dataclass(frozen=True)
class Finding:
    """One failed scenario at the template: where to point, and what to say."""

    rule: str  # a cause kind (engine.types.CAUSE_KINDS), or render-error / basic-conversation-refused
    scenario: str | None
    line: int  # in the template (1 when the cause is not a template line)
    end_line: int | None
    message: str
    elsewhere: str | None = None  # the cause's own place when it is not in the template: "vllm 0.33.0 path:12"


def findings(report: CheckReport) -> list[Finding]:
    if report.refused is not None:
        return [Finding(REFUSED, None, 1, None, f"{report.template} fails the basic conversation (first request of "
                        f"scenario {PROBE_SCENARIO}) as {report.model}'s template: {report.refused}")]
    found = []
    for cell in report.cells:
        if cell.status == "error":
            found.append(Finding(RENDER_ERROR, cell.scenario, 1, None, f"scenario {cell.scenario}: the template "
                                 f"failed to render ({cell.note or 'no detail'}), so there is no PRR result"))
            continue
        if cell.status != "breaks":
            continue
        cause = cell.cause
        if cause is None:
            found.append(Finding("unattributed", cell.scenario, 1, None, f"scenario {cell.scenario} breaks PRR "
                                 f"with engine {report.engine}; no single change explains it"))
            continue
        location = cause.location
        in_template = cause.stage == "template" and location.path == report.template
        text = (f"scenario {cell.scenario} breaks PRR with engine {report.engine_label}: "
                f"{cause.stage} {cause.kind} at {location}: {cause.detail or cause.changed}")
        if cause.fix is not None:
            text += f" Fix: {cause.fix.text}"
        found.append(Finding(cause.kind, cell.scenario, location.line if in_template and location.line else 1,
                             location.end_line if in_template else None, text,
                             None if in_template else f"{location.origin} {location}".strip()))
    return found


def _escape(text: str, property_value: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def github_annotations(report: CheckReport, template_path: str) -> str:
    """One `::error file=…,line=…::` workflow command per finding, at the template line (GitHub Actions shows each
    on the diff)."""
    lines = []
    for f in findings(report):
        props = [f"file={_escape(template_path, True)}", f"line={f.line}"]
        if f.end_line and f.end_line != f.line:
            props.append(f"endLine={f.end_line}")
        props.append(f"title={_escape(f'PRR {f.rule}' + (f' ({f.scenario})' if f.scenario else ''), True)}")
        lines.append(f"::error {','.join(props)}::{_escape(f.message)}")
    return "\n".join(lines) + ("\n" if lines else "")


def sarif_log(report: CheckReport, template_path: str) -> dict:
    """The report as a SARIF 2.1.0 log: one result per failed scenario, at its template line (code scanning shows
    it there); a cause in an engine's or the client's code is named as a related location."""
    from engine.types import CAUSE_KINDS

    path = Path(template_path)
    artifact = {"uri": path.as_uri()} if path.is_absolute() else \
        {"uri": path.as_posix(), "uriBaseId": "%SRCROOT%"}
    found = findings(report)
    rule_ids = sorted({f.rule for f in found})
    described = {**CAUSE_KINDS, RENDER_ERROR: "the template failed to render a later request: no PRR result",
                 REFUSED: "the template fails the basic conversation", "unattributed": "PRR breaks, cause unknown"}
    results = []
    for f in found:
        region = {"startLine": f.line, **({"endLine": f.end_line} if f.end_line else {})}
        result = {"ruleId": f.rule, "ruleIndex": rule_ids.index(f.rule), "level": "error",
                  "message": {"text": f.message},
                  "locations": [{"physicalLocation": {"artifactLocation": {**artifact, "index": 0}, "region": region}}],
                  "properties": {"scenario": f.scenario, "model": report.model, "engine": str(report.engine)}}
        if f.elsewhere:
            result["relatedLocations"] = [{"id": 1, "message": {"text": f"the cause: {f.elsewhere}"}}]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "drift-matrix check", "informationUri": TOOL_URI, "rules": [
                {"id": rule, "name": rule, "shortDescription": {"text": described.get(rule, rule)},
                 "defaultConfiguration": {"level": "error"}} for rule in rule_ids]}},
            "artifacts": [{"location": artifact}],
            "invocations": [{"executionSuccessful": True, "properties": {
                "model": report.model, "engine": str(report.engine), "engine_version": report.engine_version,
                "scenarios": len(report.cells), "breaks": report.breaks, "errors": report.errors}}],
            "results": results,
        }],
    }
