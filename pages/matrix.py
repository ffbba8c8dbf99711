"""Landing page: scenarios × models for one engine (or vLLM | SGLang side by side); click a cell for its break."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.errors import EngineSpecError, ExplorerError
from engine.evidence import evidence_html, matrix_csv, matrix_evidence, upload_json
from engine.matrix import cell_label, matrix_json, parser_pairs
from engine.models import LoadedModel, default_model_ids, load_spec, preload_models
from engine.sandbox import render_scope
from engine.scenario import load_scenario, scenario_ids
from engine.serving.registry import engine_versions, list_engines, spawn_releases
from engine.serving.spec import EngineFlag, EngineSpec, ParserPair
from engine.simulate import CellResult, run_cell, run_cell_with
from engine.timeline import ReleaseOutcome, TimelineRun
from pages.common import (
    LEGEND,
    WORKSPACE_PARAM,
    cached_model,
    describe_error,
    init_custom_columns,
    kwarg_state_key,
    plain,
    show_cell,
    status_style,
    through_the_app,
    user_kwargs,
    visitor_key,
)

# Fixed pixel widths keep every cell at a predictable place (the browser test clicks by position), and nine model
# columns (six models and three uploads) fit beside the sidebar at 1280 px.
INDEX_WIDTH, PAIR_INDEX_WIDTH, COLUMN_WIDTH, ROW_HEIGHT = 160, 240, 80, 35
SIDE_BY_SIDE = "vLLM | SGLang"
ENGINE_VIEWS = ("vllm", "sglang", "raw", "bridge", "renderers", SIDE_BY_SIDE)
# Streamlit's wide layout keeps 5rem on each side and a 300 px sidebar: narrower, the matrix has room at 1280 px.
PAGE_CSS = ("<style>.block-container{padding-left:1.25rem;padding-right:1.25rem}"
            "section[data-testid='stSidebar']{width:250px !important;min-width:250px !important}</style>")
# Every release: the pinned ones (emulated) first, then the others (run from their own code).
VERSIONS = {name: engine_versions(name) for name in ("vllm", "sglang")}


@dataclass(frozen=True)
class Column:
    """One matrix column: a model (stock or a custom upload); ✎ in its title when its kwargs are toggled."""

    title: str
    model_id: str
    upload_id: str | None = None
    help: str = ""
    workspace_root: str = ""  # the folder of the upload's workspace (this visitor's, or the operator's shared one)


@dataclass(frozen=True)
class Row:
    """One matrix row: a scenario under one engine (side by side, each scenario has a vLLM and an SGLang row)."""

    label: str
    scenario: str
    # The column: raw, vllm@0.33.0, ...; the sidebar's text as typed when its parser pair names none (cells say why).
    engine: EngineSpec | str


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
    runtimes = {value: label for label, value in RUNTIME_CHOICES.items() if value}
    if params.get("runtime") in runtimes:
        st.session_state["layer:runtime"] = runtimes[params["runtime"]]
    if params.get("proxies"):
        st.session_state["layer:proxies"] = [p for p in params["proxies"].split(",") if p in _proxy_choices()]
    if params.get("strip_thinking_cache") == "1":
        st.session_state["layer:strip_thinking_cache"] = True
    if params.get("default_kwargs"):
        st.session_state["layer:default_kwargs"] = params["default_kwargs"][:500]
    for problem in _kwargs_from_link(params.get("kwargs", "{}")):
        st.warning(plain(problem))
    if params.get("model") and params.get("scenario") and params.get("cell_engine"):
        selected = {"model": params["model"], "scenario": params["scenario"], "engine": params["cell_engine"],
                    "upload": params.get("upload")}
        problem = _link_cell_problem(selected)
        if problem:
            st.warning(plain(f"The link's cell was not opened: {problem}."))
        else:
            st.session_state.selected = selected


def _kwargs_from_link(text: str) -> list[str]:
    """Set the toggles a link names; one sentence for each part that is not a known model's kwarg of its type."""
    try:
        values = json.loads(text)
    except (ValueError, RecursionError):
        return ["The link's kwargs parameter is not valid JSON; it was ignored."]
    if not isinstance(values, dict):
        return ["The link's kwargs parameter must be an object of model ids; it was ignored."]
    problems = []
    models = default_model_ids()
    for model_id, kwargs in values.items():
        if model_id not in models or not isinstance(kwargs, dict):
            problems.append(f"The link's kwargs for {model_id[:40]!r} were ignored: "
                            + ("not a model here." if model_id not in models else "they must be an object."))
            continue
        known = {k.name: k for k in load_spec(model_id).template_kwargs}
        for name, value in kwargs.items():
            kwarg = known.get(name)
            expected = type(kwarg.default) if kwarg is not None and kwarg.default is not None else None
            if kwarg is None or (expected is not None and type(value) is not expected):
                what = "not one of its template kwargs" if kwarg is None else \
                    f"it must be {expected.__name__ if expected else 'a value'}, got {json.dumps(value)[:40]}"
                problems.append(f"The link's kwarg {name[:40]!r} for {model_id} was ignored: {what}.")
                continue
            st.session_state[kwarg_state_key(model_id, name)] = value
    return problems


def _link_cell_problem(selected: dict) -> str | None:
    """Why a link's selected cell cannot be opened (an unknown model, scenario, engine or upload), or None."""
    from engine.serving.registry import known_engine

    if selected["model"] not in default_model_ids():
        return f"unknown model {selected['model'][:40]!r}"
    if selected["scenario"] not in scenario_ids():
        return f"unknown scenario {selected['scenario'][:40]!r}"
    try:
        selected["engine"] = known_engine(selected["engine"])  # parsed once: the link's text is not read again
    except ExplorerError as err:
        return str(err).split(";")[0]
    upload = selected.get("upload")
    if upload and upload not in st.session_state.get("custom_columns", {}):
        return f"no stored upload {upload[:40]!r}"
    return None


def _engine_spec(name: str) -> EngineSpec | str:
    """The column the sidebar picks: raw, bridge, renderers, or vLLM / SGLang at the chosen release with the typed
    parser pair, with the layers the sidebar names around raw, vLLM and SGLang; a pair or a flag value that names
    none stays the text as typed, whose cells then say why."""
    if name not in VERSIONS:
        return _with_layers(EngineSpec.parse(name))
    release = EngineSpec.parse(name)
    version = st.session_state.get(f"ver:{name}", VERSIONS[name][0])
    pair = st.session_state.get(f"parsers:{name}", "").strip()  # "qwen3+hermes": the engine's own CLI names
    try:
        spec = dataclasses.replace(release, version=version, parsers=ParserPair.parse(pair) if pair else None)
    except EngineSpecError:
        return f"{name}@{version}/{pair}"
    try:
        return _with_layers(spec)
    except EngineSpecError:  # the flag's value as typed: its cells say why
        return f"{spec}[default-chat-template-kwargs={st.session_state.get('layer:default_kwargs', '').strip()}]"


# The layers the sidebar offers (issue 27): a template runtime, proxies and client profiles, SGLang's and vLLM's
# history-changing server flags.
RUNTIME_CHOICES = {"transformers' Jinja": None, "MiniJinja": "minijinja", "@huggingface/jinja": "hfjs"}


def _proxy_choices() -> list[str]:
    from engine.serving.proxies import known_proxies
    from engine.serving.proxies.litellm import STRIPPING

    return [*known_proxies(), f"litellm@{STRIPPING}"]


def _with_layers(spec: EngineSpec) -> EngineSpec:
    """`spec` with the sidebar's layers, where the column takes them (raw, vLLM, SGLang); flags on vLLM and SGLang
    only, each where that engine has it. A flag value that is not a JSON object raises EngineSpecError."""
    if spec.kind not in ("raw", "vllm", "sglang"):
        return spec
    runtime = RUNTIME_CHOICES.get(st.session_state.get("layer:runtime", "transformers' Jinja"))
    proxies = tuple(p for p in st.session_state.get("layer:proxies", []) if p in _proxy_choices())
    flags: list[EngineFlag] = []
    if spec.kind == "sglang" and st.session_state.get("layer:strip_thinking_cache"):
        flags.append(EngineFlag("strip-thinking-cache"))
    defaults = st.session_state.get("layer:default_kwargs", "").strip()
    if spec.is_serving_engine and defaults:
        flags.append(EngineFlag.parse(f"default-chat-template-kwargs={defaults}", kind=spec.kind, engine=str(spec)))
    return dataclasses.replace(spec, runtime=runtime, proxies=proxies,
                               flags=tuple(flags) if spec.is_serving_engine else ())


def _apply_fix(fix: dict) -> None:
    """Button callback: runs before the rerun, so widget state can still be set."""
    selected = st.session_state.get("selected") or {}
    if fix.get("kind") == "kwarg" and selected:
        st.session_state[kwarg_state_key(selected["model"], fix["kwarg"])] = fix["value"]
    elif fix.get("kind") == "engine":
        release = EngineSpec.parse(fix["engine"])  # a release of the cell's own engine, or the column less a layer
        if release.version is not None:
            st.session_state[f"ver:{release.kind}"] = release.version
        st.session_state.engine_view = release.kind
        if release.runtime is None:
            st.session_state["layer:runtime"] = "transformers' Jinja"
        st.session_state["layer:proxies"] = list(release.proxies)
        st.session_state["layer:strip_thinking_cache"] = release.flag("strip-thinking-cache") is not None
        selected["engine"] = release
    elif fix.get("kind") == "bridge":
        st.session_state.engine_view = "bridge"
        selected["engine"] = EngineSpec("bridge")


@st.cache_resource(show_spinner=False, max_entries=512)
def _custom_cell(upload_id: str, workspace_root: str, scenario: str, engine: str, kwargs_json: str,
                 explain: bool = True) -> CellResult:
    from engine.workspace import Workspace

    model = Workspace(workspace_root).load_model(upload_id)
    return run_cell_with(model, scenario, engine, json.loads(kwargs_json), explain=explain)


def _custom_model(upload_id: str, workspace_root: str) -> LoadedModel:
    from engine.workspace import Workspace

    return Workspace(workspace_root).load_model(upload_id)


def _sidebar(models: list[str]) -> tuple[list[str], list[str], str]:
    sb = st.sidebar
    sb.radio("Engine", ENGINE_VIEWS, key="engine_view", help="raw: lossless parse (the template alone); bridge: the "
             "next prompt appended to the previous token ids; renderers: PrimeIntellect's renderers package as "
             "prime-rl calls it (bridge_to_next_turn, else a full render); vLLM | SGLang: a row for each, ≠ where "
             "they differ")
    for name, versions in VERSIONS.items():
        sb.selectbox(f"{name} version", versions, key=f"ver:{name}")
        sb.text_input(f"{name} parsers", key=f"parsers:{name}", placeholder="the model's own",
                      help="reasoning+tool parser by the engine's CLI names, e.g. qwen3+hermes (- for none)")
    with sb.expander("Layers between the model and the cache", expanded=bool(
            st.session_state.get("layer:proxies") or st.session_state.get("layer:strip_thinking_cache")
            or st.session_state.get("layer:default_kwargs") or
            st.session_state.get("layer:runtime", "transformers' Jinja") != "transformers' Jinja")):
        st.selectbox("Template runtime", list(RUNTIME_CHOICES), key="layer:runtime",
                     help="who renders the model's template for raw, vLLM and SGLang: transformers' Jinja, MiniJinja "
                          "(Rust servers and gateways) or @huggingface/jinja (transformers.js)")
        st.multiselect("Proxy or client", _proxy_choices(), key="layer:proxies",
                       help="between the client and the engine, client side first: LiteLLM's own hosted_vllm code "
                            "(litellm@1.104.9 dropped reasoning_content) or a client profile (proxy_profiles/)")
        st.checkbox("SGLang --strip-thinking-cache", key="layer:strip_thinking_cache",
                    help="the cache keeps only the prompt of a reply that reasoned")
        st.text_input("--default-chat-template-kwargs", key="layer:default_kwargs",
                      placeholder='{"preserve_thinking": true}',
                      help="the server's template kwargs (vLLM and SGLang), used where the request sets none")
    sb.radio("Level", ("token", "string"), key="level", horizontal=True)
    # The kwargs come before the long model and scenario pickers, so that they stay in view.
    sb.markdown("**Template kwargs**")
    chosen_models = st.session_state.get("models", models)
    for model_id in [m for m in models if m in chosen_models]:
        spec = load_spec(model_id)
        if not spec.template_kwargs:
            continue
        changed = [k.name for k in spec.template_kwargs
                   if st.session_state.get(kwarg_state_key(model_id, k.name), k.default) != k.default]
        with sb.expander(f"{model_id} ✎ {', '.join(changed)}" if changed else model_id):
            for kwarg in spec.template_kwargs:
                key = kwarg_state_key(model_id, kwarg.name)
                if isinstance(kwarg.default, bool):
                    st.checkbox(kwarg.name, value=kwarg.default, key=key, help=kwarg.help)
                elif kwarg.choices:
                    st.selectbox(kwarg.name, kwarg.choices, index=list(kwarg.choices).index(kwarg.default), key=key,
                                 help=kwarg.help)
    with sb.expander("Models and scenarios", expanded=False):
        chosen_models = st.multiselect("Models", models, default=models, key="models")
        chosen_scenarios = st.multiselect("Scenarios", scenario_ids(), default=scenario_ids(), key="scenarios")
    return chosen_models, chosen_scenarios, st.session_state.engine_view


def _columns(models: list[str], loaded: dict[str, LoadedModel]) -> list[Column]:
    columns = []
    custom = st.session_state.get("custom_columns", {})
    for model_id in models:
        if model_id not in loaded:
            continue
        changed = user_kwargs(loaded[model_id])
        mark = " ✎" if changed else ""
        toggled = ("; kwargs " + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(changed.items()))
                   if changed else "")
        spec = loaded[model_id].spec
        source = loaded[model_id].renderer.source_path
        columns.append(Column(f"{model_id}{mark}", model_id,
                              help=f"{spec.display_name} ({spec.hub_repo}): template {source}{toggled}"))
        for upload_id, (label, base, root) in custom.items():
            if base == model_id:
                columns.append(Column(f"{model_id}+{label}{mark}", model_id, upload_id,
                                      help=f"your upload {label} ({upload_id[:12]}) for {model_id}{toggled}; "
                                           f"◆ where it differs from the stock {source}", workspace_root=root))
    # Titles index the table: two equal ones would take the whole page down (labels are unique per base model, so
    # this is a guard for hand-edited stores).
    seen: set[str] = set()
    for i, column in enumerate(columns):
        if column.title in seen:
            columns[i] = dataclasses.replace(column, title=f"{column.title} ({column.upload_id or i})")
        seen.add(columns[i].title)
    return columns


def _rows(scenarios: list[str], view: str) -> list[Row]:
    if view != SIDE_BY_SIDE:
        return [Row(s, s, _engine_spec(view)) for s in scenarios]
    return [Row(f"{s} · {spec}", s, spec) for s in scenarios for spec in (_engine_spec("vllm"), _engine_spec("sglang"))]


def _run(column: Column, row: Row, kwargs: dict, *, explain: bool) -> CellResult:
    """One cell. The grid shows statuses and prefixes (`explain=False`): a cause is a search of counterfactual
    re-runs, computed when the cell is opened or exported."""
    if column.upload_id is None:
        return run_cell(column.model_id, row.scenario, row.engine, kwargs, explain=explain)
    return _custom_cell(column.upload_id, column.workspace_root, row.scenario, str(row.engine),
                        json.dumps(kwargs, sort_keys=True), explain)


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
    st.html(PAGE_CSS)
    st.title("Drift matrix")
    st.caption("Does the model's own output survive into the next prompt? Each cell runs a scripted agent "
               "conversation through the model's real template, the engine's parsers and the real tokenizer.")
    init_custom_columns()
    _init_from_url()
    models, scenarios, view = _sidebar(default_model_ids())
    if not models or not scenarios:
        st.info("Pick at least one model and one scenario in the sidebar.")
        return
    started = time.perf_counter()
    rows = _rows(scenarios, view)
    # The rows' releases start loading in their workers now, beside the templates and tokenizers (a cold result cache
    # asks them; a warm one never waits on them)
    spawn_releases([row.engine for row in rows], parser_pairs(models))
    with st.spinner("Loading the real templates and tokenizers (first view only)…"):
        preload_models(models)  # two at a time (a failure is said below, by the model it belongs to)
        loaded = {}
        for model_id in models:
            try:
                loaded[model_id] = cached_model(model_id)
            except BaseException as err:  # noqa: BLE001 - a model that cannot load is shown, the others still run
                st.error(plain(f"Model {model_id} cannot be loaded: {describe_error(err)}"))
    loaded_s = time.perf_counter() - started
    columns = _columns(models, loaded)
    level = st.session_state.level
    started = time.perf_counter()
    grid: dict[tuple[str, str], CellResult] = {}
    runs = [(column, row, user_kwargs(loaded[column.model_id])) for column in columns for row in rows]
    # A cold release (its first cells run its code in a fresh worker) takes seconds a column: say how far it is.
    progress = st.empty()
    for done, (column, row, kwargs) in enumerate(runs):
        if done % len(rows or [0]) == 0 and time.perf_counter() - started > PROGRESS_AFTER_S:
            progress.progress(done / len(runs), text=f"Running the roundtrips: {done} of {len(runs)} cells "
                                                     f"({column.model_id} × {row.engine})…")
        grid[(row.label, column.title)] = _guarded_run(column, row, kwargs, explain=False)
    progress.empty()
    elapsed = time.perf_counter() - started
    labels = _labels(grid, rows, columns, level, pairs=view == SIDE_BY_SIDE)
    frame = pd.DataFrame([[labels[(r.label, c.title)] for c in columns] for r in rows],
                         index=pd.Index([r.label for r in rows], name="scenario"), columns=[c.title for c in columns])
    st.caption(LEGEND)
    if view == SIDE_BY_SIDE:
        st.caption(f"Each scenario has a row for {_engine_spec('vllm')} and one for {_engine_spec('sglang')}; "
                   "≠ marks both cells where the two engines differ.")
    descriptions = "\n".join(f"- **{s}**: {load_scenario(s).description}" for s in scenarios)
    config = {"_index": st.column_config.TextColumn("scenario", width=PAIR_INDEX_WIDTH if view == SIDE_BY_SIDE
                                                    else INDEX_WIDTH, help=descriptions)}
    config.update({c.title: st.column_config.TextColumn(c.title, width=COLUMN_WIDTH, help=c.help) for c in columns})
    event = st.dataframe(frame.style.map(status_style), on_select="rerun", selection_mode="single-cell",
                         key="matrix", column_config=config, height=ROW_HEIGHT * (len(rows) + 1) + 3, width="content")
    cells_picked = event.selection.cells if event and event.selection else []
    # A click selects a cell once: the grid's selection outlives re-runs that rename a column (✎ after a kwarg
    # toggle) or change the rows (the side-by-side view), and must not re-select something else then.
    picked = (tuple(cells_picked[0]), view) if cells_picked else None
    if picked is not None and picked != st.session_state.get("matrix_picked"):
        st.session_state.matrix_picked = picked
        index, title = cells_picked[0]
        column = next((c for c in columns if c.title.removesuffix(" ✎") == str(title).removesuffix(" ✎")), None)
        if column is not None and index < len(rows):
            row = rows[index]
            st.session_state.selected = {"model": column.model_id, "scenario": row.scenario, "engine": row.engine,
                                         "upload": column.upload_id}
    all_cells = list(grid.values())

    def explained_cells() -> list[CellResult]:  # the exports carry every cause: computed when asked for
        return [_guarded_run(column, row, kwargs, explain=True) for column, row, kwargs in runs]

    # Loading only shows on a fresh server (models are cached across sessions after that).
    loading = f"; the real templates and tokenizers loaded in {loaded_s:.1f} s" if loaded_s >= 0.05 else ""
    st.caption(f"{len(all_cells)} cells in {elapsed:.2f} s{loading}.")
    _exports(explained_cells, loaded)
    with st.expander("Prefill saved vs lost, per model", expanded=False):
        st.plotly_chart(_plot(all_cells), width="stretch")
    _detail(loaded)
    _write_url()


def _labels(grid: dict[tuple[str, str], CellResult], rows: list[Row], columns: list[Column], level: str, *,
            pairs: bool) -> dict[tuple[str, str], str]:
    """Each cell's label, ◆ where an upload's cell differs from its stock model's, ≠ on both rows of a scenario
    where vLLM and SGLang differ."""
    plain = {key: cell_label(cell, level) for key, cell in grid.items()}
    stock_of = {c.title: next(s.title for s in columns if s.model_id == c.model_id and s.upload_id is None)
                for c in columns if c.upload_id is not None}
    labels = {}
    for (row_label, title), label in plain.items():
        stock = stock_of.get(title)
        if stock is not None and plain.get((row_label, stock), label) != label:
            label += " ◆"
        labels[(row_label, title)] = label
    if pairs:
        for vllm_row, sglang_row in zip(rows[::2], rows[1::2]):
            for c in columns:
                a, b = (vllm_row.label, c.title), (sglang_row.label, c.title)
                if plain[a] != plain[b]:
                    labels[a], labels[b] = f"≠ {labels[a]}", f"≠ {labels[b]}"
    return labels


PROGRESS_AFTER_S = 0.5  # a grid from the caches shows at once, with no bar flashing by


def _guarded_run(column: Column, row: Row, kwargs: dict, *, explain: bool) -> CellResult:
    try:
        return _run(column, row, kwargs, explain=explain)
    except BaseException as err:  # noqa: BLE001 - a failing custom column (a panic too) stays in its cells
        return CellResult(column.model_id, row.scenario, str(row.engine), "", kwargs, "error",
                          note=describe_error(err))


def _exports(explained_cells: Callable[[], list[CellResult]], loaded: dict[str, LoadedModel]) -> None:
    cols = st.columns(4)
    # Built when clicked, not on every script run: the causes and serializing every cell's boundaries are most of the
    # work.
    cols[0].download_button("Matrix CSV", lambda: matrix_csv(explained_cells()), "drift-matrix.csv", "text/csv",
                            key="export:csv", on_click="ignore")
    cols[1].download_button("Matrix JSON",
                            lambda: json.dumps(matrix_json(explained_cells()), ensure_ascii=False, indent=2),
                            "drift-matrix.json", "application/json", key="export:json", on_click="ignore")
    if cols[2].button("Prepare evidence (JSON + HTML)", key="export:prepare"):
        stock = [c for c in explained_cells() if c.model in loaded and "+" not in c.model]
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
        described = None
        if upload:
            column = st.session_state.custom_columns.get(upload)
            if column is None:
                raise ExplorerError(f"the upload {upload[:12]} is hidden on the Custom templates page, or was removed")
            root = column.workspace_root
            model = _custom_model(upload, root)
            cell = _custom_cell(upload, root, scenario, str(selected["engine"]),
                                json.dumps(user_kwargs(loaded[selected["model"]]), sort_keys=True))
            described = upload_json(root, upload)  # its evidence carries the template: it replays
        else:
            cell = run_cell(model.id, scenario, selected["engine"], user_kwargs(model))
        show_cell(cell, model, _apply_fix, key="detail", upload=described)
    except BaseException as err:  # noqa: BLE001 - the detail fails alone (a panic too); the matrix stays usable
        st.error(plain(f"This cell cannot be shown: {describe_error(err)}"))
    try:
        _release_strip(selected, user_kwargs(loaded[selected["model"]]))
    except BaseException as err:  # noqa: BLE001 - the strip fails alone
        st.error(plain(f"The release strip cannot be shown: {describe_error(err)}"))


# The strip's colours: the matrix's status colours (STATUS_COLOURS), darker: a thin bar needs more contrast.
STRIP_COLOURS = {"holds": "#4ac26b", "breaks": "#e5534b", "error": "#d4a72c", "unavailable": "#afb8c1"}


@st.cache_resource(show_spinner=False, max_entries=64)
def _timeline_run(model_id: str, scenario: str, engine: str, pair: ParserPair | None, kwargs_json: str) -> TimelineRun:
    """One background run per cell, shared by every session: each release's cell is computed once (and cached by
    the simulator), so a second visitor or a re-run sees the strip at once."""
    return TimelineRun(model_id, scenario, engine, kwargs=json.loads(kwargs_json), pair=pair).start()


def _strip_cell(selected: dict) -> EngineSpec | None:
    """The engine of a stock cell on a vLLM or SGLang release, else None."""
    engine = selected["engine"]
    if not isinstance(engine, EngineSpec) or engine.kind not in VERSIONS or engine.version is None \
            or selected.get("upload"):
        return None
    return engine


def _release_strip(selected: dict, kwargs: dict) -> None:
    """This cell on every release of its engine, coloured by status, computed on demand in the background; a click on
    a release opens that release's cell."""
    cell = _strip_cell(selected)
    if cell is None:
        return
    name, version, pair = cell.kind, cell.version or "", cell.parsers
    args = (selected["model"], selected["scenario"], name, pair, json.dumps(kwargs, sort_keys=True))
    key = "strip:" + json.dumps([*args[:3], str(pair or ""), args[4]])
    started = st.session_state.setdefault("strips_started", set())
    st.markdown(f"**This cell on every {name} release**")
    if key not in started:
        st.caption(f"{len(VERSIONS[name])} releases, each run from its own code (about a second each the first "
                   "time, then kept while the server runs); the page stays usable meanwhile.")
        slot = st.empty()
        if not slot.button("Show the release strip", key=f"{key}:start"):
            return
        slot.empty()
        started.add(key)
    run = _timeline_run(*args)
    if run.done:
        _draw_strip(run, key, name, version, pair)
    else:
        _strip_progress(args, key, name, version)


@st.fragment(run_every=2.0)
def _strip_progress(args: tuple, key: str, name: str, version: str) -> None:
    """Redrawn every two seconds while the run fills in (only this fragment reruns); the whole page once it is done."""
    run = _timeline_run(*args)
    if run.done:
        st.rerun()
    rows = run.rows()
    st.progress(len(rows) / max(1, len(run.versions)),
                text=f"{len(rows)} of {len(run.versions)} {name} releases run…")
    if rows:
        st.plotly_chart(_strip_figure(rows, run.versions, version), key=f"{key}:live", config={"displayModeBar": False})


def _draw_strip(run: TimelineRun, key: str, name: str, version: str, pair: ParserPair | None) -> None:
    rows = run.rows()
    if run.error:
        st.error(plain(run.error))
    changes = [r.version for r in rows if r.changed]
    st.caption(f"{len(rows)} releases, oldest left; ● marks a release whose outcome differs from the one before"
               + (f" ({', '.join(changes)})" if changes else " (none)") + "; the outlined one is this cell. "
               "Click a release to open its cell.")

    def open_release() -> None:
        points = st.session_state[f"{key}:chart"].selection.points
        if points:
            picked = str(points[0]["x"])
            # the strip ran every release from its own code: the pinned ones too (real:), so the cell matches its bar
            release = dataclasses.replace(EngineSpec.parse(name), version=picked, parsers=pair)
            release = dataclasses.replace(release, real_code=release.release in list_engines())
            st.session_state.selected = {**st.session_state.selected, "engine": release}

    st.plotly_chart(_strip_figure(rows, run.versions, version), key=f"{key}:chart", on_select=open_release,
                    selection_mode="points", config={"displayModeBar": False})


def _strip_figure(rows: list[ReleaseOutcome], versions: list[str], current: str) -> go.Figure:
    """One bar per release, coloured by status; hover: status, first break, cause. Releases not run yet are blank."""
    by_version = {r.version: r for r in rows}
    colours, outlines, hover, marks = [], [], [], []
    for version in versions:
        row = by_version.get(version)
        colours.append(STRIP_COLOURS[row.status] if row else "#ffffff")
        outlines.append(3 if version == current else 0.5)
        marks.append("●" if row and row.changed else "")
        if row is None:
            hover.append(f"{version}: not run yet")
            continue
        cause = row.cause or {}
        where = f"<br>{cause.get('stage')} {cause.get('kind')} {cause.get('location')}" if cause else ""
        note = f"<br>{row.note[:120]}" if row.note else ""
        broke = f" at boundary {row.first_break}" if row.first_break else ""
        hover.append(f"{row.release}: {row.status}{broke}{where}{note}")
    figure = go.Figure(go.Bar(x=versions, y=[1] * len(versions), marker_color=colours, marker_line_color="#24292f",
                              marker_line_width=outlines, hovertext=hover, hoverinfo="text", text=marks,
                              textposition="outside", cliponaxis=False, textfont={"size": 14, "color": "#24292f"}))
    figure.update_layout(height=150, margin={"l": 10, "r": 10, "t": 18, "b": 10}, bargap=0.08, showlegend=False,
                         yaxis={"visible": False, "range": [0, 1.35]}, plot_bgcolor="rgba(0,0,0,0)",
                         xaxis={"type": "category", "tickangle": -60, "tickfont": {"size": 10}})
    return figure


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
    runtime = RUNTIME_CHOICES.get(st.session_state.get("layer:runtime", "transformers' Jinja"))
    if runtime:
        params["runtime"] = runtime
    if st.session_state.get("layer:proxies"):
        params["proxies"] = ",".join(st.session_state["layer:proxies"])
    if st.session_state.get("layer:strip_thinking_cache"):
        params["strip_thinking_cache"] = "1"
    if st.session_state.get("layer:default_kwargs", "").strip():
        params["default_kwargs"] = st.session_state["layer:default_kwargs"].strip()
    selected = st.session_state.get("selected")
    if selected:
        params.update(model=selected["model"], scenario=selected["scenario"], cell_engine=str(selected["engine"]))
        if selected.get("upload"):
            params["upload"] = selected["upload"]
    params[WORKSPACE_PARAM] = visitor_key()  # last: the link keeps this visitor's uploads (pages/common.py)
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


# One scope per script run: a custom template that hits a limit is stopped once in this view, not once a cell.
through_the_app()
with render_scope():
    main()
