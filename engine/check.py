"""`python -m engine check`: a template author's CI gate — every scenario through a template file."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import ExplorerError
from engine.models import load_model, special_token_vars
from engine.sandbox import SandboxedRenderer, render_scope
from engine.scenario import scenario_ids
from engine.simulate import CellResult, run_cell_with


@dataclass(frozen=True)
class CheckReport:
    cells: tuple[CellResult, ...]

    @property
    def breaks(self) -> bool:
        return any(c.status in ("breaks", "error") for c in self.cells)

    @property
    def text(self) -> str:
        lines = []
        for c in self.cells:
            where = f" {c.cause.stage} {c.cause.location}: {c.cause.detail[:100]}" if c.cause else ""
            note = f" ({c.note})" if c.status in ("error", "unavailable") and c.note else ""
            lines.append(f"{c.status:<11} {c.scenario}{where}{note}")
        broken = sum(c.status in ("breaks", "error") for c in self.cells)
        lines.append(f"{broken} of {len(self.cells)} scenarios break PRR")
        return "\n".join(lines)


def check_template(model_id: str, template: Path, engine: str = "raw") -> CheckReport:
    from engine.uploads import UploadLimits, decode_text, read_path

    limits = UploadLimits.from_env()
    # Read as an upload is: under its size cap, UTF-8 without NUL bytes or a BOM, not empty.
    source = decode_text(read_path(template, "a chat template", limits.max_text_bytes,
                                   limits.cap_setting("chat_template")), str(template))
    if not source.strip():
        raise ExplorerError(f"{template} is empty" + (" (only whitespace)" if source else ""))
    stock = load_model(model_id)
    # A template under test is someone else's code: it renders in the sandbox, with the base model's token variables.
    renderer = SandboxedRenderer(source, model=f"{model_id} (custom)", source_path=template.name,
                                 special_tokens=special_token_vars(stock.spec))
    model = replace(stock, renderer=renderer)
    # One scope: a template that hits the time limit on one scenario is not rendered again on the others.
    with render_scope():
        return CheckReport(tuple(run_cell_with(model, s, engine, {}) for s in scenario_ids()))
