"""Your traffic: upload a real trace (a vLLM or SGLang request log, RL rollouts, an agent trajectory), see where its
prefix cache broke and why; or write your own conversation and run it as a matrix row."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import yaml

from engine.matrix import cell_label
from engine.models import LoadedModel, default_model_ids
from engine.scenario import scenario_from_data
from engine.serving.registry import list_engines
from engine.serving.spec import EngineSpec
from engine.simulate import run_cell_with
from engine.traces.evidence import step_view, trace_evidence, trace_markdown
from engine.traces.readers import FORMATS
from engine.traces.report import TraceReport, analyse_trace
from engine.traces.store import StoredTrace, TraceLimits, TraceStore
from engine.workspace import READ_ONLY_ENV
from pages.common import (
    cached_model,
    describe_error,
    own_workspace,
    plain,
    shared_workspace,
    show_break,
    show_cause,
    show_view,
    through_the_app,
)

NO_REPLAY = "none (figures only)"
EXAMPLE = """\
id: my-conversation
description: My agent's first two turns.
preamble: coding-agent
tools: [get_weather]
turns:
  - user: What's the weather in Paris today?
  - assistant:
      reasoning: The user wants today's weather. I should call get_weather.
      tool_calls: [{name: get_weather, arguments: {city: Paris}}]
  - tool: "sunny, 21°C"
  - assistant:
      reasoning: The tool answered.
      content: It is sunny and 21°C in Paris.
  - user: And tomorrow?
"""


def _own_store() -> TraceStore:
    """This visitor's traces (their workspace, pages/common.py), under the cap their uploads share."""
    workspace = own_workspace()
    return TraceStore(workspace.root, visitor_limits=workspace.visitor_limits)


@st.cache_resource(show_spinner=False, max_entries=8)
def _analysed(path: str, sha256: str, name: str, model_id: str, engine: str | None, block_size: int) -> TraceReport:
    # Keyed by the stored file's hash: a trace never changes once stored.
    # Each break is replayed at once (cheap); its cause is attributed when it is opened (blame re-renders per
    # candidate change, seconds on a long prompt). Bad records are left out, as the upload said.
    return analyse_trace(path, cached_model(model_id), engine=engine, block_size=block_size, name=name,
                         attribute=False, skip_bad_records=True)


def _upload(store: TraceStore) -> None:
    with st.form("traffic:upload_form", clear_on_submit=True):
        upload = st.file_uploader("A trace file: " + ", ".join(f.title for f in FORMATS.values()),
                                  key="traffic:file", help=f"up to {TraceLimits.from_env().max_bytes >> 20} MB "
                                  "here; a larger log: python -m engine trace FILE")
        submitted = st.form_submit_button("Store and analyse", type="primary")
    if not submitted or upload is None:
        return
    with st.spinner("Reading every record…"):
        try:
            stored = store.add(upload.name, upload.getvalue())
        except Exception as err:  # noqa: BLE001 - a refused file is one sentence; nothing stored is touched
            st.error(plain(describe_error(err)))
            return
    st.session_state["traffic:trace"] = stored.id
    st.session_state["traffic:pick"] = stored.id  # the picker shows the new trace (its own state would keep the last)
    st.success(plain(f"Stored {stored.name} ({stored.format}, {stored.requests} requests, {stored.sessions} "
                     f"session(s)) as {stored.id} in your workspace."))


def _bad_records(trace: StoredTrace) -> None:
    """The bad records the analysis leaves out: one sentence each for the first ones, then how many more."""
    if not trace.skipped_count:
        return
    lines = [plain(sentence) for sentence in trace.skipped]
    more = trace.skipped_count - len(trace.skipped)
    if more:
        lines.append(f"and {more} more bad record{'s' if more > 1 else ''}.")
    records = f"{trace.skipped_count} bad record{'s' if trace.skipped_count > 1 else ''}"
    kept = f"{trace.requests} request{'s are' if trace.requests > 1 else ' is'}"
    st.warning(plain(f"{trace.name}: {records} left out; its other {kept} analysed below.")
               + "\n\n" + "\n".join(f"- {line}" for line in lines))


def _choose(store: TraceStore, shared: TraceStore) -> StoredTrace | None:
    """This visitor's traces (they may remove one), then the operator's shared ones (read-only)."""
    traces, skipped = store.list()
    for problem in skipped:
        st.warning(plain(problem))
    own = {t.id for t in traces}
    traces += [t for t in shared.list()[0] if t.id not in own]  # the operator's problems are not the visitor's
    if not traces:
        st.info("No trace stored yet: upload one above, or try a sample from samples/traces/.")
        return None
    ids = [t.id for t in traces]
    current = st.session_state.get("traffic:trace")
    cols = st.columns([6, 1])
    chosen = cols[0].selectbox("Trace", ids, index=ids.index(current) if current in ids else max(0, len(own) - 1),
                               format_func=lambda i: next(f"{t.name} · {t.format} · {t.requests} requests · {t.id}"
                                                          + ("" if i in own else " · shared by the operator")
                                                          for t in traces if t.id == i), key="traffic:pick")
    st.session_state["traffic:trace"] = chosen
    if chosen in own and not own_workspace().read_only and cols[1].button("Remove", key="traffic:remove"):
        store.remove(chosen)
        st.session_state.pop("traffic:trace", None)
        st.rerun()
    return next(t for t in traces if t.id == chosen)


def _sessions_table(report: TraceReport) -> pd.DataFrame:
    return pd.DataFrame([{
        "session": n, "id": s.key, "token ids": s.ids_source, "requests": len(s.steps),
        "prompt tokens": s.prompt_tokens, "reused": s.reused_tokens, "prefilled": s.prompt_tokens - s.reused_tokens,
        "breaks": s.breaks, "cache lost (tokens)": s.lost_tokens,
    } for n, s in enumerate(report.sessions, start=1)])


def _requests_table(report: TraceReport, session: int) -> pd.DataFrame:
    rows = []
    for step in report.sessions[session - 1].steps:
        replay = report.replays.get((session, step.row.index))
        cause = replay.cause if replay else None
        rows.append({
            "request": step.row.index, "where": step.request.where, "prompt": step.row.prompt_tokens,
            "reused": step.row.reusable_tokens, "prefill": step.row.prefill_tokens,
            f"block-{report.block_size} reused": step.row.block_reusable_tokens,
            "hybrid reused": step.row.hybrid_reusable_tokens, "server says cached": step.request.cached_tokens,
            "breaks": f"✗ at token {step.first_break.token}" if step.first_break else "",
            "cause": f"{cause.stage} ({cause.kind})" if cause else
            ("" if replay is None else "reproduced: select it" if replay.reproduced else "not reproduced"),
        })
    return pd.DataFrame(rows)


def _chart(report: TraceReport, session: int) -> go.Figure:
    steps = report.sessions[session - 1].steps
    labels = [str(s.row.index) for s in steps]
    fig = go.Figure([
        go.Bar(name="reused (prefix cache)", x=labels, y=[s.row.reusable_tokens for s in steps],
               marker_color="#2da44e"),
        go.Bar(name="prefilled", x=labels, y=[s.row.prefill_tokens for s in steps], marker_color="#cf222e"),
        go.Scatter(name="breaks", x=[str(s.row.index) for s in steps if s.breaks],
                   y=[s.row.prompt_tokens for s in steps if s.breaks], mode="markers",
                   marker=dict(symbol="x", size=12, color="#000")),
    ])
    fig.update_layout(barmode="stack", height=320, margin=dict(t=30, b=10), xaxis_title="request",
                      xaxis_type="category", yaxis_title="tokens", legend=dict(orientation="h"))
    return fig


def _cause(report: TraceReport, model: LoadedModel, session: int, request: int) -> None:
    if (session, request) not in report.replays:
        st.info("Pick the engine that served this trace above to replay the break and find its cause.")
        return
    with st.spinner("Attributing the break (a re-run per candidate change)…"):
        replay = report.attribute(session, request)
    assert replay is not None
    if replay.cause is not None:
        show_cause(replay.cause, model, None, f"traffic:cause:{session}:{request}")
    (st.success if replay.reproduced else st.warning)(replay.detail)
    if not replay.reproduced and replay.differs_at_char is not None:
        cols = st.columns(2)
        cols[0].caption("the real next prompt, from where they part")
        cols[0].code(replay.real_snippet, language=None)
        cols[1].caption(f"the replay through {replay.engine}")
        cols[1].code(replay.replay_snippet, language=None)


def _break(report: TraceReport, model: LoadedModel, session: int, request: int) -> None:
    step = report.sessions[session - 1].steps[request - 1]
    b = step.first_break
    if b is None:
        st.success(f"Request {request} reuses the whole previous sequence ({step.row.reusable_tokens} tokens).")
        return
    st.markdown(f"**Request {request}** ({step.request.where}) reuses {step.row.reusable_tokens} of request "
                f"{request - 1}'s {step.row.previous_sequence_tokens}-token sequence and prefills "
                f"{step.row.prefill_tokens}; first differing token {b.token} ({b.previous_token_text!r} → "
                f"{b.next_token_text!r}), first differing character {b.char}.")
    _cause(report, model, session, request)
    context = st.slider("Tokens of context on each side", 2, 40, 8, key="traffic:context")
    try:
        show_view(step_view(model, report, session, request, context))
    except Exception as err:  # noqa: BLE001
        st.error(describe_error(err))


def _exports(report: TraceReport, model: LoadedModel) -> None:
    stem = report.source.rsplit(".", 1)[0]
    cols = st.columns(2)
    cols[0].download_button("Evidence JSON", lambda: json.dumps(trace_evidence(report, model), ensure_ascii=False,
                                                                indent=2), f"{stem}.evidence.json",
                            "application/json", key="traffic:json", on_click="ignore")
    cols[1].download_button("Markdown", lambda: trace_markdown(report), f"{stem}.md", "text/markdown",
                            key="traffic:md", on_click="ignore")


def _own_conversation(engine: str) -> None:
    st.subheader("Your own conversation as a matrix row")
    st.caption("Write it in the scenario format (scenarios/*.yaml: user, assistant with reasoning / content / "
               "tool_calls, tool turns; tools by name from scenarios/tools.yaml), or fill the form.")
    with st.expander("Form"):
        with st.form("traffic:form"):
            user = st.text_input("User", "What's the weather in Paris today?")
            reasoning = st.text_input("Model's reasoning", "The user wants the weather. I should call get_weather.")
            city = st.text_input("It calls get_weather with city", "Paris")
            result = st.text_input("Tool result", "sunny, 21°C")
            answer = st.text_input("Model's answer", "It is sunny and 21°C.")
            follow = st.text_input("Next user message", "And tomorrow?")
            if st.form_submit_button("Write it as YAML"):
                st.session_state["traffic:yaml"] = yaml.safe_dump({
                    "id": "my-conversation", "description": "Written with the form.", "preamble": "coding-agent",
                    "tools": ["get_weather"],
                    "turns": [{"user": user}, {"assistant": {"reasoning": reasoning, "tool_calls": [
                        {"name": "get_weather", "arguments": {"city": city}}]}}, {"tool": result},
                        {"assistant": {"reasoning": "The tool answered.", "content": answer}}, {"user": follow}],
                }, sort_keys=False, allow_unicode=True)
    text = st.text_area("Scenario YAML", value=st.session_state.get("traffic:yaml", EXAMPLE), height=300,
                        key="traffic:yaml_editor")
    if st.button("Run as a matrix row", key="traffic:run_row"):
        st.session_state["traffic:row"] = text
    source = st.session_state.get("traffic:row")
    if not source:
        return
    try:
        raw = yaml.safe_load(source)
        if not isinstance(raw, dict):
            raise ValueError("the YAML is not a mapping with id and turns")
        scenario = scenario_from_data(raw, "your conversation")
    except Exception as err:  # noqa: BLE001 - the editor keeps the text; the sentence says what to change
        st.error(f"Your conversation cannot be read: {describe_error(err)}")
        return
    cells = {}
    with st.spinner("Running the row…"):
        for model_id in default_model_ids():
            try:
                cells[model_id] = run_cell_with(cached_model(model_id), scenario, engine, {})
            except Exception as err:  # noqa: BLE001 - one model failing leaves the row
                st.warning(f"{model_id}: {describe_error(err)}")
    st.dataframe(pd.DataFrame([{m: cell_label(c) for m, c in cells.items()}], index=[scenario.id]))
    breaking = [m for m, c in cells.items() if c.status == "breaks"]
    if not breaking:
        return
    chosen = st.selectbox("Break of", breaking, key="traffic:row_model")
    cell = cells[chosen]
    if cell.cause is not None:
        show_cause(cell.cause, cached_model(chosen), None, "traffic:row")
    focus = cell.focus
    if focus is not None:
        show_break(cached_model(chosen), focus, "traffic:row")


def main() -> None:
    st.title("Your traffic")
    st.caption("Load what your server or agent logged: where the prefix cache broke, request by request, and why. "
               "Token ids are the ground truth; each break is replayed through the engine you name.")
    store = _own_store()
    if own_workspace().read_only:
        st.info(f"This server is read-only ({READ_ONLY_ENV}): storing a trace is turned off here.")
    else:
        _upload(store)
    stored = _choose(store, TraceStore(shared_workspace().root))
    if stored is not None:
        _bad_records(stored)
    models = default_model_ids()
    cols = st.columns(3)
    model_id = cols[0].selectbox("Model that served it", models, index=models.index("qwen3.5"), key="traffic:model")
    engine_choice = cols[1].selectbox("Engine that served it (replays each break)", [*list_engines(), "raw", NO_REPLAY],
                                      key="traffic:engine")
    block = int(cols[2].number_input("Block size", 1, 256, 16, key="traffic:block"))
    engine = None if engine_choice == NO_REPLAY else engine_choice
    if stored is not None:
        try:
            with st.spinner("Analysing…"):
                report = _analysed(str(stored.path), stored.sha256, stored.name, model_id, engine, block)
                model = cached_model(model_id)
        except Exception as err:  # noqa: BLE001 - the page shows the sentence; the stored trace stays
            st.error(plain(f"{stored.name} cannot be analysed: {describe_error(err)}"))
        else:
            _report(report, model)
    replayed = EngineSpec.parse(engine) if engine else None  # the picker's choice: raw or an emulated release
    _own_conversation(engine if replayed and replayed.is_serving_engine else "vllm")


def _report(report: TraceReport, model: LoadedModel) -> None:
    st.subheader("Sessions")
    event = st.dataframe(_sessions_table(report), hide_index=True, on_select="rerun", selection_mode="single-row",
                         key="traffic:sessions")
    rows = event.selection.rows if event and event.selection else []
    default = next((n for n, s in enumerate(report.sessions, start=1) if s.breaks), 1)
    session = rows[0] + 1 if rows else default
    replayed = f", breaks replayed through {report.engine}" if report.engine else ""
    st.markdown(f"**Session {session}** ({report.sessions[session - 1].key}{replayed}): select a request that breaks.")
    st.plotly_chart(_chart(report, session), width="stretch", key=f"traffic:chart:{session}")
    picked = st.dataframe(_requests_table(report, session), hide_index=True, on_select="rerun",
                          selection_mode="single-row", key=f"traffic:requests:{session}")
    chosen = picked.selection.rows if picked and picked.selection else []
    if chosen:
        _break(report, model, session, chosen[0] + 1)
    _exports(report, model)


through_the_app()
main()
