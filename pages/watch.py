"""Live watch: what a running `python -m engine watch` has seen, read from its folder: sessions as they arrive, every
break with its cause, and the break view of one (the same analysis `trace` runs, over the records file)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from engine.traces.evidence import step_view
from engine.traces.report import TraceReport, analyse_trace
from engine.watch.live import WatchSnapshot, read_watch
from pages.common import cached_model, describe_error, show_cause, show_view, through_the_app

REFRESH_S = 2.0


@st.cache_resource(show_spinner=False, max_entries=4)
def _analysed(records: str, size: int, model_id: str, engine: str | None, block_size: int) -> TraceReport:
    # Keyed by the records' size: the watch only appends, so a size names what was read.
    return analyse_trace(records, cached_model(model_id), engine=engine, block_size=block_size, attribute=False)


def _sessions(snapshot: WatchSnapshot) -> pd.DataFrame:
    return pd.DataFrame([{
        "session": s["session"], "id": s["key"], "requests": len(s["requests"]),
        "prompt tokens": s["totals"]["prompt_tokens"], "reused": s["totals"]["reused_tokens"],
        "prefilled": s["totals"]["prefill_tokens"], "breaks": s["totals"]["breaks"],
        "cache lost (tokens)": s["totals"]["lost_tokens"],
        "server says cached": sum(r["server_cached_tokens"] or 0 for r in s["requests"]),
    } for s in snapshot.report["sessions"]])


def _breaks(snapshot: WatchSnapshot) -> pd.DataFrame:
    rows = []
    for b in snapshot.breaks():
        cause = b.get("cause") or {}
        rows.append({"session": b["session"], "request": b["index"],
                     "cause": f"{cause.get('stage')} ({cause.get('kind')})" if cause else
                     (b.get("replay") or {}).get("detail", "not replayed"), "at": cause.get("location", ""),
                     "id": b["key"], "record": b["where"], "reused": b["reused_tokens"],
                     "prefill": b["prefill_tokens"], "first differing token": b["first_break"]["token"]})
    return pd.DataFrame(rows)


def _status(snapshot: WatchSnapshot) -> None:
    status, live = snapshot.status, snapshot.live
    cols = st.columns(5)
    cols[0].metric("Exchanges recorded", status.get("recorded", 0))
    cols[1].metric("Analysed", live.get("analysed", 0))
    cols[2].metric("Not analysed live", status.get("dropped", 0), help="the analysis queue was full; still in the "
                   "records file: python -m engine trace reads them")
    cols[3].metric("Sessions", len(snapshot.report["sessions"]))
    cols[4].metric("Breaks", len(snapshot.breaks()))
    cache = live.get("cache") or {}
    if cache.get("compared"):
        st.caption(f"The upstream reports cached tokens for {cache['compared']} requests: measured "
                   f"{cache['measured']} vs predicted {cache['predicted']} from each session's own history; "
                   f"{cache['below']} below the prediction (the server lost what the session should have kept), "
                   f"{cache['above']} above it (a prefix shared with other sessions).")
    st.caption(f"{status.get('upstream', '?')} · model {status.get('model', '?')} · engine "
               f"{status.get('engine') or 'none'} · analysis {status.get('analysis', '?')} · "
               f"{snapshot.records}")
    for sentence in live.get("errors") or []:
        st.warning(sentence)


def _break_view(snapshot: WatchSnapshot, session: int, request: int) -> None:
    status = snapshot.status
    model_id, engine = status.get("model"), status.get("engine")
    if not model_id:
        st.info("The watch's status names no model yet.")
        return
    try:
        with st.spinner("Reading the records…"):
            report = _analysed(str(snapshot.records), snapshot.records.stat().st_size, model_id, engine,
                               int(status.get("block_size", 16)))
            model = cached_model(model_id)
        replay = report.attribute(session, request)
        if replay is not None and replay.cause is not None:
            show_cause(replay.cause, model, None, f"watch:cause:{session}:{request}")
        if replay is not None:
            (st.success if replay.reproduced else st.warning)(replay.detail)
        show_view(step_view(model, report, session, request, 8))
    except Exception as err:  # noqa: BLE001 - the page shows the sentence; the watch goes on
        st.error(describe_error(err))


def main() -> None:
    st.title("Live watch")
    st.caption("Point `python -m engine watch --upstream http://HOST:PORT/v1 --model M --engine vllm@V` at your "
               "server and your clients at the watch: each chat exchange is recorded, and every break of the prefix "
               "cache is shown here with its cause as it happens.")
    folder = st.text_input("The watch's folder (--out)", st.session_state.get("watch:folder", "drift-watch"),
                           key="watch:folder")

    @st.fragment(run_every=REFRESH_S)
    def live() -> None:
        try:
            snapshot = read_watch(Path(folder))
        except Exception as err:  # noqa: BLE001 - no watch there yet: one sentence, and the page keeps looking
            st.info(describe_error(err))
            return
        _status(snapshot)
        st.subheader("Sessions")
        st.dataframe(_sessions(snapshot), hide_index=True)
        st.subheader("Breaks")
        table = _breaks(snapshot)
        if table.empty:
            st.success("No break so far: every prompt extends its session's previous sequence.")
            return
        # The cause and its place are what a reader looks for: wide enough to read whole.
        picked = st.dataframe(table, hide_index=True, on_select="rerun", selection_mode="single-row",
                              key="watch:breaks", column_config={
                                  "cause": st.column_config.TextColumn(width="medium"),
                                  "at": st.column_config.TextColumn(width="large")})
        rows = picked.selection.rows if picked and picked.selection else []
        if rows:
            row = table.iloc[rows[0]]
            _break_view(snapshot, int(row["session"]), int(row["request"]))

    live()


through_the_app()
main()
