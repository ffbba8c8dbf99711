"""What one whole agent task costs in prefill, request by request, under token, block and hybrid accounting."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.evidence import compare, rendered_sequence
from engine.models import LoadedModel, default_model_ids
from engine.session import (
    ACCOUNTINGS,
    CHECKPOINT_POLICIES,
    WHAT_IFS,
    SessionReport,
    SessionSettings,
    break_view,
    load_session,
    run_what_if,
    session_ids,
    simulate_session,
)
from pages.common import cached_model, describe_error, plain, show_view, through_the_app

# What the page offers for the replies: the template alone, or through an engine (its default version).
ENGINE_CHOICES: dict[str, str | None] = {"template only": None, "raw split": "raw", "through vLLM": "vllm",
                                         "through SGLang": "sglang"}


def _chart(report: SessionReport) -> go.Figure:
    labels = [f"request {r.index}" for r in report.rows]
    fig = go.Figure([
        go.Bar(name="reused (prefix cache)", x=labels, y=[r.reusable_tokens for r in report.rows],
               marker_color="#2da44e"),
        go.Bar(name="prefilled", x=labels, y=[r.prefill_tokens for r in report.rows], marker_color="#cf222e"),
        go.Bar(name="decoded", x=labels, y=[r.decode_tokens or 0 for r in report.rows], marker_color="#0969da"),
    ])
    fig.update_layout(barmode="stack", height=340, margin=dict(t=30, b=10), yaxis_title="tokens",
                      legend=dict(orientation="h"))
    return fig


def _table(report: SessionReport) -> pd.DataFrame:
    return pd.DataFrame([{
        "request": r.index, "after": r.trigger, "prompt": r.prompt_tokens, "reused": r.reusable_tokens,
        # The last request's reply is not scripted: "…" as the CLI prints it, not a raw None.
        "prefill": r.prefill_tokens, "decode": "…" if r.decode_tokens is None else str(r.decode_tokens),
        f"block-{report.block_size} reused":
        r.block_reusable_tokens, "hybrid reused": r.hybrid_reusable_tokens,
        "breaks": "✗ short of the previous sequence" if r.breaks else "",
    } for r in report.rows])


def _totals(report: SessionReport) -> None:
    names = {"token": "token-level", "block": f"{report.block_size}-token blocks", "hybrid": "hybrid model"}
    cols = st.columns(1 + len(ACCOUNTINGS))
    cols[0].metric("prompt tokens", report.total_prompt_tokens)
    for col, accounting in zip(cols[1:], ACCOUNTINGS):
        col.metric(f"prefill, {names[accounting]}", report.totals(accounting).prefill_tokens)


def _request_break(model: LoadedModel, report: SessionReport, index: int) -> None:
    view = break_view(model, report, index)
    if view is None:
        st.success(f"Request {index} reuses the whole previous sequence.")
        return
    st.markdown(f"**Request {index}** reuses {view.token_position} tokens of request {view.compared_request}'s "
                f"{len(view.previous_ids)}-token sequence; the texts first differ at char {view.char_position}.")
    for side, location in (("previous", view.previous_location), ("next", view.next_location)):
        if location is not None:
            st.markdown(f"- {side}: `{location.path}:{location.line}` `{location.text.strip()}`")
    context = st.slider("Tokens of context on each side", 2, 40, 8, key="session:context")
    shown = compare(model.tokenizer,
                    rendered_sequence(f"request {view.compared_request}'s sequence", view.previous,
                                      view.previous_tokens),
                    rendered_sequence(f"request {index}'s prompt", view.next, view.next_tokens),
                    boundary=index, source_path=view.next.source_path, context=context)
    show_view(shown)


def _what_if(model: LoadedModel, script, settings: SessionSettings) -> None:
    st.subheader("What if…")
    name = st.radio("Experiment", list(WHAT_IFS), format_func=lambda n: WHAT_IFS[n].title, horizontal=True,
                    key="session:what_if")
    st.caption(WHAT_IFS[name].summary)
    try:
        result = run_what_if(name, model, script, settings)
    except BaseException as err:  # noqa: BLE001 - one experiment failing (a panic too) leaves the rest of the page
        st.error(plain(f"{WHAT_IFS[name].title}: {describe_error(err)}"))
        return
    st.markdown(f"**{result.before_label}** → **{result.after_label}**: {result.description}")
    st.dataframe(pd.DataFrame([{
        "request": r.index, "prompt before": r.prompt_before, "prompt after": r.prompt_after,
        "reused before": r.reusable_before, "reused after": r.reusable_after,
        "prefill before": r.prefill_before, "prefill after": r.prefill_after,
        "block reused before": r.block_reusable_before, "block reused after": r.block_reusable_after,
    } for r in result.requests]), hide_index=True, key="session:what_if_table")


def main() -> None:
    st.title("Agent session")
    st.caption("One agent task as its chain of requests: what the prefix cache reuses, what must be prefilled, "
               "what is decoded (the handbook's accounting, for your model and template). Click a request that "
               "breaks to see where.")
    cols = st.columns(5)
    models = default_model_ids()
    model_id = cols[0].selectbox("Model", models, index=models.index("qwen3.5"), key="session:model")
    script_id = cols[1].selectbox("Script", session_ids(), key="session:script")
    engine_choice = cols[2].selectbox("Replies", ENGINE_CHOICES, key="session:engine",
                                      help="the template alone renders the scripted replies; through an engine, "
                                           "each reply is written as model output, parsed by the engine and sent "
                                           "back as a client does, so each sequence is prompt + completion")
    block = cols[3].number_input("Block size (1 = token-level radix, as SGLang)", 1, 256, 16, key="session:block")
    policy = cols[4].selectbox("Hybrid checkpoint policy", CHECKPOINT_POLICIES, key="session:policy")
    engine = ENGINE_CHOICES[engine_choice]
    try:
        with st.spinner("Loading the template and tokenizer…"):
            model = cached_model(model_id)
        script = load_session(script_id)
        report = simulate_session(model, script, block_size=int(block), checkpoint_policy=policy, engine=engine)
    except BaseException as err:  # noqa: BLE001 - the page shows the reason (a panic too); other pages keep working
        st.error(plain(f"The session cannot be simulated: {describe_error(err)}"))
        return
    event = st.dataframe(_table(report), hide_index=True, key="session:table", on_select="rerun",
                         selection_mode="single-row")
    _totals(report)
    st.plotly_chart(_chart(report), width="stretch")
    rows = event.selection.rows if event and event.selection else []
    breaking = [r.index for r in report.rows if r.breaks]
    if rows:
        _request_break(model, report, report.rows[rows[0]].index)
    elif breaking:
        st.info(f"Request(s) {', '.join(map(str, breaking))} reuse less than the whole previous sequence: select one "
                "in the table to see the break.")
    _what_if(model, script, SessionSettings(dict(script.kwargs), int(block), policy, engine))


through_the_app()
main()
