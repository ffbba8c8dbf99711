"""Landing page: scenarios × models for one engine (or vLLM | SGLang side by side); click a cell for its break."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.evidence import evidence_html, matrix_csv, matrix_evidence
from engine.matrix import cell_label, matrix_json
from engine.models import LoadedModel, default_model_ids, load_spec
from engine.parsers import engine_versions
from engine.scenario import load_scenario, scenario_ids
from engine.simulate import CellResult, run_cell, run_cell_with
from pages.common import (
    LEGEND,
    cached_model,
    describe_error,
    kwarg_state_key,
    show_cell,
    status_style,
    user_kwargs,
)

INDEX_WIDTH, COLUMN_WIDTH, ROW_HEIGHT = 170, 130, 35
ENGINE_VIEWS = ("vllm", "sglang", "raw", "bridge", "vLLM | SGLang")
# Every release: the pinned ones (emulated) first, then the others (run from their own code).
VERSIONS = {name: engine_versions(name) for name in ("vllm", "sglang")}


@dataclass(frozen=True)
class Column:
    """One matrix column: a model (stock or a custom upload) under one engine."""

    title: str
    model_id: str
    engine: str  # engine argument: "vllm@0.33.0", "raw", ...
    upload_id: str | None = None


def _init_from_url() -> None:
    """A shared link reopens the same view: engine, versions, level, kwargs and the selected cell."""
    if st.session_state.get("url_loaded"):
        return
    st.session_state.url_loaded = True
    params = st.query_params
    if params.get("engine") in ENGINE_VIEWS:
        st.session_state.engine_view = params["engine"]
    for name in VERSIONS:
        if params.get(name) in VERSIONS[name]:
            st.session_state[f"ver:{name}"] = params[name]
        if params.get(f"{name}_parsers"):
            st.session_state[f"parsers:{name}"] = params[f"{name}_parsers"]
    if params.get("level") in ("token", "string"):
        st.session_state.level = params["level"]
    try:
        for model_id, values in json.loads(params.get("kwargs", "{}")).items():
            for name, value in values.items():
                st.session_state[kwarg_state_key(model_id, name)] = value
    except (ValueError, AttributeError):
        st.warning("The link's kwargs parameter is not valid JSON; it was ignored.")
    if params.get("model") and params.get("scenario") and params.get("cell_engine"):
        st.session_state.selected = {"model": params["model"], "scenario": params["scenario"],
                                     "engine": params["cell_engine"], "upload": params.get("upload")}


def _engine_spec(name: str) -> str:
    if name not in VERSIONS:
        return name
    pair = st.session_state.get(f"parsers:{name}", "").strip()  # "qwen3+hermes": the engine's own CLI names
    return f"{name}@{st.session_state.get(f'ver:{name}', VERSIONS[name][0])}" + (f"/{pair}" if pair else "")


def _apply_fix(fix: dict) -> None:
    """Button callback: runs before the rerun, so widget state can still be set."""
    selected = st.session_state.get("selected") or {}
    if fix.get("kind") == "kwarg" and selected:
        st.session_state[kwarg_state_key(selected["model"], fix["kwarg"])] = fix["value"]
    elif fix.get("kind") == "engine":
        name, _, version = fix["engine"].partition("@")
        st.session_state[f"ver:{name}"] = version
        st.session_state.engine_view = name
        selected["engine"] = fix["engine"]
    elif fix.get("kind") == "bridge":
        st.session_state.engine_view = "bridge"
        selected["engine"] = "bridge"


@st.cache_resource(show_spinner=False, max_entries=2048)
def _custom_cell(upload_id: str, workspace_root: str, scenario: str, engine: str, kwargs_json: str) -> CellResult:
    from engine.workspace import Workspace

    model = Workspace(workspace_root).load_model(upload_id)
    return run_cell_with(model, scenario, engine, json.loads(kwargs_json))


def _custom_model(upload_id: str, workspace_root: str) -> LoadedModel:
    from engine.workspace import Workspace

    return Workspace(workspace_root).load_model(upload_id)


def _sidebar(models: list[str]) -> tuple[list[str], list[str], str]:
    sb = st.sidebar
    sb.radio("Engine", ENGINE_VIEWS, key="engine_view", help="raw: lossless parse (the template alone); bridge: the "
             "next prompt appended to the previous token ids")
    for name, versions in VERSIONS.items():
        sb.selectbox(f"{name} version", versions, key=f"ver:{name}")
        sb.text_input(f"{name} parsers", key=f"parsers:{name}", placeholder="the model's own",
                      help="reasoning+tool parser by the engine's CLI names, e.g. qwen3+hermes (- for none)")
    sb.radio("Level", ("token", "string"), key="level", horizontal=True)
    chosen_models = sb.multiselect("Models", models, default=models, key="models")
    chosen_scenarios = sb.multiselect("Scenarios", scenario_ids(), default=scenario_ids(), key="scenarios")
    sb.markdown("**Template kwargs**")
    for model_id in chosen_models:
        spec = load_spec(model_id)
        toggles = [k for k in spec.template_kwargs if isinstance(k.default, bool)]
        if toggles:
            with sb.expander(model_id):
                for kwarg in toggles:
                    st.checkbox(kwarg.name, value=kwarg.default, key=kwarg_state_key(model_id, kwarg.name),
                                help=kwarg.help)
    return chosen_models, chosen_scenarios, st.session_state.engine_view


def _columns(models: list[str], view: str) -> list[Column]:
    engines = ["vllm", "sglang"] if view == "vLLM | SGLang" else [view]
    columns = []
    custom = st.session_state.get("custom_columns", {})
    for model_id in models:
        for name in engines:
            spec = _engine_spec(name)
            suffix = f" · {name}" if len(engines) > 1 else ""
            columns.append(Column(f"{model_id}{suffix}", model_id, spec))
            for upload_id, (label, base) in custom.items():
                if base == model_id:
                    columns.append(Column(f"{model_id}+{label}{suffix}", model_id, spec, upload_id))
    return columns


def _run(column: Column, scenario: str, kwargs: dict) -> CellResult:
    if column.upload_id is None:
        return run_cell(column.model_id, scenario, column.engine, kwargs)
    return _custom_cell(column.upload_id, _workspace_root(), scenario, column.engine,
                        json.dumps(kwargs, sort_keys=True))


def _plot(cells: list[CellResult]) -> go.Figure:
    saved: dict[str, int] = {}
    lost: dict[str, int] = {}
    for cell in cells:
        focus = cell.focus
        if focus is None or focus.token_prefix is None or cell.status not in ("holds", "breaks"):
            continue
        saved[cell.model] = saved.get(cell.model, 0) + focus.token_prefix.common
        lost[cell.model] = lost.get(cell.model, 0) + focus.token_prefix.prev_len - focus.token_prefix.common
    models = list(saved)
    fig = go.Figure([go.Bar(name="prefill saved (reused tokens)", x=models, y=[saved[m] for m in models],
                            marker_color="#2da44e"),
                     go.Bar(name="prefill lost (tokens computed again)", x=models, y=[lost[m] for m in models],
                            marker_color="#cf222e")])
    fig.update_layout(barmode="stack", height=320, margin=dict(t=30, b=10), yaxis_title="tokens, summed over cells",
                      legend=dict(orientation="h"))
    return fig


def main() -> None:
    st.title("Drift matrix")
    st.caption("Does the model's own output survive into the next prompt? Each cell runs a scripted agent "
               "conversation through the model's real template, the engine's parsers and the real tokenizer.")
    _init_from_url()
    _init_custom_columns()
    models, scenarios, view = _sidebar(default_model_ids())
    if not models or not scenarios:
        st.info("Pick at least one model and one scenario in the sidebar.")
        return
    started = time.perf_counter()
    with st.spinner("Loading the real templates and tokenizers (first view only)…"):
        loaded = {}
        for model_id in models:
            try:
                loaded[model_id] = cached_model(model_id)
            except Exception as err:  # noqa: BLE001 - a model that cannot load is shown, the others still run
                st.error(f"Model {model_id} cannot be loaded: {describe_error(err)}")
    loaded_s = time.perf_counter() - started
    columns = [c for c in _columns(models, view) if c.model_id in loaded]
    level = st.session_state.level
    started = time.perf_counter()
    with st.spinner("Running the roundtrips…"):
        grid: dict[tuple[str, str], CellResult] = {}
        for column in columns:
            kwargs = user_kwargs(loaded[column.model_id])
            for scenario in scenarios:
                try:
                    grid[(scenario, column.title)] = _run(column, scenario, kwargs)
                except Exception as err:  # noqa: BLE001 - one failing custom column must not take the page down
                    grid[(scenario, column.title)] = CellResult(column.model_id, scenario, column.engine, "", kwargs,
                                                                "error", note=describe_error(err))
    elapsed = time.perf_counter() - started
    frame = pd.DataFrame(
        [[_label(grid[(s, c.title)], level, c, grid, s) for c in columns] for s in scenarios],
        index=pd.Index(scenarios, name="scenario"), columns=[c.title for c in columns])
    st.caption(LEGEND + " · ◆ custom template differs from the stock one")
    # Fixed pixel widths keep every cell at a predictable place (the browser test clicks by position).
    config = {"_index": st.column_config.TextColumn("scenario", width=INDEX_WIDTH)}
    config.update({c.title: st.column_config.TextColumn(c.title, width=COLUMN_WIDTH) for c in columns})
    event = st.dataframe(frame.style.map(status_style), on_select="rerun", selection_mode="single-cell",
                         key="matrix", column_config=config, height=ROW_HEIGHT * (len(scenarios) + 1) + 3)
    cells_picked = event.selection.cells if event and event.selection else []
    if cells_picked:
        row, title = cells_picked[0]
        column = next(c for c in columns if c.title == title)
        st.session_state.selected = {"model": column.model_id, "scenario": scenarios[row], "engine": column.engine,
                                     "upload": column.upload_id}
    all_cells = list(grid.values())
    # Loading only shows on a fresh server (models are cached across sessions after that).
    loading = f"; the real templates and tokenizers loaded in {loaded_s:.1f} s" if loaded_s >= 0.05 else ""
    st.caption(f"{len(all_cells)} cells in {elapsed:.2f} s{loading}.")
    _exports(all_cells, loaded)
    with st.expander("Prefill saved vs lost, per model", expanded=False):
        st.plotly_chart(_plot(all_cells), width="stretch")
    _detail(loaded)
    _write_url()


def _label(cell: CellResult, level: str, column: Column, grid: dict, scenario: str) -> str:
    label = cell_label(cell, level)
    if column.upload_id is not None:
        stock = grid.get((scenario, column.title.replace(f"+{_upload_label(column.upload_id)}", "")))
        if stock is not None and cell_label(stock, level) != label:
            label += " ◆"
    return label


def _upload_label(upload_id: str) -> str:
    return st.session_state.get("custom_columns", {}).get(upload_id, ("", ""))[0]


def _exports(cells: list[CellResult], loaded: dict[str, LoadedModel]) -> None:
    cols = st.columns(4)
    # Built when clicked, not on every script run: serializing every cell's boundaries is most of a re-run.
    cols[0].download_button("Matrix CSV", lambda: matrix_csv(cells), "drift-matrix.csv", "text/csv",
                            key="export:csv", on_click="ignore")
    cols[1].download_button("Matrix JSON", lambda: json.dumps(matrix_json(cells), ensure_ascii=False, indent=2),
                            "drift-matrix.json", "application/json", key="export:json", on_click="ignore")
    stock = [c for c in cells if c.model in loaded and "+" not in c.model]
    if cols[2].button("Prepare evidence (JSON + HTML)", key="export:prepare"):
        st.session_state.matrix_evidence = (
            json.dumps(matrix_evidence(stock, loaded), ensure_ascii=False, indent=2),
            evidence_html(stock, loaded))
    if "matrix_evidence" in st.session_state:
        evidence, page = st.session_state.matrix_evidence
        cols[2].download_button("Evidence JSON", evidence, "drift-evidence.json", "application/json",
                                key="export:evidence", on_click="ignore")
        cols[3].download_button("Evidence HTML", page, "drift-evidence.html", "text/html", key="export:html",
                                on_click="ignore")


def _detail(loaded: dict[str, LoadedModel]) -> None:
    selected = st.session_state.get("selected")
    if not selected or selected.get("model") not in loaded:
        st.info("Click a cell of the matrix to see its break, the code line that caused it and how to fix it.")
        return
    model = loaded[selected["model"]]
    st.divider()
    try:
        scenario = load_scenario(selected["scenario"]).id
        upload = selected.get("upload")
        if upload:
            model = _custom_model(upload, _workspace_root())
            cell = _custom_cell(upload, _workspace_root(), scenario, selected["engine"],
                                json.dumps(user_kwargs(loaded[selected["model"]]), sort_keys=True))
        else:
            cell = run_cell(model.id, scenario, selected["engine"], user_kwargs(model))
        show_cell(cell, model, _apply_fix, key="detail")
    except Exception as err:  # noqa: BLE001 - the detail fails alone; the matrix above stays usable
        st.error(f"This cell cannot be shown: {describe_error(err)}")


def _write_url() -> None:
    params: dict[str, str] = {"engine": st.session_state.engine_view, "level": st.session_state.level}
    for name in VERSIONS:
        params[name] = st.session_state.get(f"ver:{name}", VERSIONS[name][0])
        if st.session_state.get(f"parsers:{name}", "").strip():
            params[f"{name}_parsers"] = st.session_state[f"parsers:{name}"].strip()
    changed: dict[str, dict] = {}
    for model_id in st.session_state.get("models", []):
        for kwarg in load_spec(model_id).template_kwargs:
            value = st.session_state.get(kwarg_state_key(model_id, kwarg.name), kwarg.default)
            if value != kwarg.default:
                changed.setdefault(model_id, {})[kwarg.name] = value
    if changed:
        params["kwargs"] = json.dumps(changed, sort_keys=True)
    selected = st.session_state.get("selected")
    if selected:
        params.update(model=selected["model"], scenario=selected["scenario"], cell_engine=selected["engine"])
        if selected.get("upload"):
            params["upload"] = selected["upload"]
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


def _init_custom_columns() -> None:
    """After a refresh or a restart, every stored upload is a column again (the custom page can hide it)."""
    if "custom_columns" in st.session_state:
        return
    st.session_state.custom_columns = {}
    try:
        from engine.workspace import Workspace

        listing = Workspace(_workspace_root()).list()
    except Exception as err:  # noqa: BLE001 - an unreadable workspace must not take the matrix down
        st.warning(f"Stored uploads cannot be read: {describe_error(err)}")
        return
    st.session_state.custom_columns = {u.id: (u.label, u.base_model) for u in listing.uploads}


def _workspace_root() -> str:
    """Read only when a custom column is shown, so the stock matrix never touches the workspace."""
    if "workspace_root" not in st.session_state:
        from engine.workspace import default_root

        st.session_state.workspace_root = str(default_root())
    return st.session_state.workspace_root


main()
