"""What one whole agent task costs in prefill, request by request, under token, block and hybrid accounting."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.models import default_model_ids
from engine.session import CHECKPOINT_POLICIES, SessionReport, load_session, session_ids, simulate_session
from pages.common import cached_model, describe_error


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
        "prefill": r.prefill_tokens, "decode": r.decode_tokens, f"block-{report.block_size} reused":
        r.block_reusable_tokens, "hybrid reused": r.hybrid_reusable_tokens,
    } for r in report.rows])


def main() -> None:
    st.title("Agent session")
    st.caption("One agent task as its chain of requests: what the prefix cache reuses, what must be prefilled, "
               "what is decoded (the handbook's accounting, for your model and template).")
    cols = st.columns(4)
    model_id = cols[0].selectbox("Model", default_model_ids(), index=default_model_ids().index("qwen3.5"),
                                 key="session:model")
    script_id = cols[1].selectbox("Script", session_ids(), key="session:script")
    block = cols[2].number_input("Block size (1 = token-level radix, as SGLang)", 1, 256, 16, key="session:block")
    policy = cols[3].selectbox("Hybrid checkpoint policy", CHECKPOINT_POLICIES, key="session:policy")
    try:
        with st.spinner("Loading the template and tokenizer…"):
            model = cached_model(model_id)
        report = simulate_session(model, load_session(script_id), block_size=int(block), checkpoint_policy=policy)
    except Exception as err:  # noqa: BLE001 - the page shows the reason; the other pages keep working
        st.error(f"The session cannot be simulated: {describe_error(err)}")
        return
    st.dataframe(_table(report), hide_index=True, key="session:table")
    totals = st.columns(4)
    totals[0].metric("prompt tokens", report.total_prompt_tokens)
    totals[1].metric("prefill, token-level", report.total_prefill_tokens)
    totals[2].metric(f"prefill, {report.block_size}-token blocks", report.total_block_prefill_tokens)
    totals[3].metric("prefill, hybrid model", report.total_hybrid_prefill_tokens)
    st.plotly_chart(_chart(report), width="stretch")


main()
