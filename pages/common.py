"""What the pages share: cached models, the cell detail view (token diff, cause card, fix button) and exports.

Everything computed comes from `engine`; this module only lays it out.
"""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import pandas as pd
import streamlit as st

from engine.errors import ExplorerError, is_panic
from engine.evidence import (
    COMPLETION,
    EVIDENCE_CSS,
    BreakView,
    break_view,
    cause_url,
    cell_evidence,
    cell_markdown,
    char_diff_html,
    engine_spec,
    evidence_html,
    explain_error,
    side_by_side_html,
    source_excerpt,
    visible,
)
from engine.models import LoadedModel, load_model
from engine.scenario import load_scenario
from engine.serving.rendering import cell_model
from engine.simulate import Boundary, CellResult
from engine.types import Cause, Location
from engine.workspace import (
    Workspace,
    default_root,
    expire_visitor_workspaces,
    mark_used,
    new_visitor_key,
    visitor_key_problem,
    visitor_workspace,
)

STATUS_COLOURS = {"holds": "#dafbe1", "breaks": "#ffebe9", "error": "#fff8c5", "unavailable": "#eaeef2"}
LEGEND = ("✓ holds: the previous prompt + completion is a prefix of the next prompt · "
          "✗ -N tok: breaks, N tokens of the previous sequence must be prefilled again (chr: string level) · "
          "✓ str: holds as a string, breaks as tokens (string level shown) · "
          "! error: the template or engine refuses the request · – unavailable: not emulated or no tokenizer · "
          "◆ your upload differs from the stock template · ✎ the column's template kwargs are toggled · "
          "hover a header for its template, a scenario header for every scenario")


@st.cache_resource(show_spinner=False)
def cached_model(model_id: str) -> LoadedModel:
    return load_model(model_id)


def through_the_app() -> None:
    """Rerun through app.py's navigation when Streamlit ran this page file directly: a fresh server whose first request
    is a page URL (a shared /matrix?... link) starts in Streamlit's legacy pages/ mode, which skips app.py (its layout,
    page names, the hidden /matrix page) for every session until one opens "/". Streamlit 1.67 keeps that mode in
    `PagesManager.uses_pages_directory`, which st.navigation clears; the rerun keeps the URL and its parameters (app.py
    names each page by its file too). Once a session: a rerun drops a button's press, and AppTest sets the mode again
    before each of its runs."""
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory and not st.session_state.get("through_the_app"):
        st.session_state.through_the_app = True
        PagesManager.uses_pages_directory = False
        st.rerun()


def status_style(label: str) -> str:
    status = {"✓": "holds", "✗": "breaks", "!": "error", "–": "unavailable"}.get(label.removeprefix("≠ ")[:1], "")
    return f"background-color: {STATUS_COLOURS[status]}" if status else ""


def _css() -> None:
    st.html(f"<style>{EVIDENCE_CSS.replace('body{', '.drift-body{')}</style>")


def show_break(model: LoadedModel, boundary: Boundary, key: str) -> None:
    """A matrix boundary: the figures, then the break view."""
    context = st.slider("Tokens of context on each side", 2, 40, 8, key=f"{key}:context")
    view = break_view(model, boundary, context)
    s = boundary.string_prefix
    where = f"char {view.first_char} ({s.common}/{s.prev_len} kept)"
    if boundary.token_prefix is not None:
        t = boundary.token_prefix
        where += f", token {view.first_token} ({t.common}/{t.prev_len} kept, {boundary.prefill_tokens} to prefill)"
    st.markdown(f"**Boundary {boundary.index}** (client appended a {boundary.trigger} message): first difference at "
                f"{where}.")
    show_view(view)


def show_view(view: BreakView) -> None:
    """The two sequences side by side around the first break, and a character diff of the same window."""
    _css()
    if view.level == "token":
        st.html(side_by_side_html(view))
    else:
        st.caption("String level (no tokenizer for this model): rows are spans from one message and template line.")
        rows = [{"previous": r.text, "from (previous)": _from(r.message_index, r.source_line),
                 "next": n.text, "from (next)": _from(n.message_index, n.source_line)}
                for r, n in zip(view.prev.rows, view.next.rows)]
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    st.markdown("Character diff of the window (red: only in the previous sequence, green: only in the next):")
    st.html(char_diff_html(view))


def _from(message_index: int, line: int) -> str:
    if message_index == COMPLETION:
        return "model output"
    return (f"message {message_index}" if message_index >= 0 else "template") + (f", line {line}" if line else "")


def cause_card(cell: CellResult, model: LoadedModel, apply_fix: Callable[[dict], None] | None, key: str) -> None:
    """The construct that changed the model's text first, then where the differing character was emitted, what changed,
    the re-run that proves it, and the fix (itself proved by a re-run)."""
    if cell.cause is not None:
        show_cause(cell.cause, model, apply_fix, key)


# What the two sides of an edit are, by the cause's stage.
EDIT_SIDES = {"parser": ("engine was given", "engine returned"), "proxy": ("the client sent", "the proxy forwarded"),
              "cache": ("the previous sequence", "what the cache keeps")}


def show_cause(cause: Cause, model: LoadedModel, apply_fix: Callable[[dict], None] | None, key: str) -> None:
    """The cause card of a matrix cell or of a replayed trace step."""
    with st.container(border=True):
        url = cause_url(cause, model)
        location = f"[`{cause.location}`]({url})" if url else f"`{cause.location}`"
        st.markdown(f"**Cause: {cause.stage}** ({cause.kind}) at {location} in {cause.origin}")
        st.caption(cause.explanation)
        st.text(cause.changed)  # the model's text and the template's: shown as text, never as Markdown
        if cause.line_text:
            st.code(cause.line_text, language=None)
        if cause.stage in ("template", "runtime"):
            _template_lines(model, cause.location)  # the construct's lines, highlighted
            for emitted in cause.locations[1:]:
                st.text(f"Emitted at {emitted}:")
                st.code(emitted.text, language=None)
        if cause.contrast is not None:  # a runtime cause: the construct rendered alone under both runtimes
            contrast = cause.contrast
            st.text(f"Rendered alone with the same inputs: {contrast.construct}")
            st.code(contrast.inputs, language="json")
            cols = st.columns(2)
            cols[0].caption(contrast.reference)
            cols[0].code(visible(contrast.reference_output) or "(empty)", language=None)
            cols[1].caption(contrast.runtime)
            cols[1].code(visible(contrast.runtime_output) or "(empty)", language=None)
        elif cause.edit is not None and cause.stage != "template":
            before, after = EDIT_SIDES.get(cause.stage, EDIT_SIDES["parser"])
            cols = st.columns(2)
            cols[0].caption(before)
            cols[0].code(visible(cause.edit.before) or "(empty)", language=None)
            cols[1].caption(after)
            cols[1].code(visible(cause.edit.after) or "(empty)", language=None)
        st.caption(plain(f"Proof: {cause.proof}"))
        if cause.fix:
            fix = cause.fix
            label = f"Apply fix: {fix.text}"
            # A client fix is the caller's to make: the scenario defines how its client behaves.
            if apply_fix is None or fix.kind not in ("kwarg", "engine", "bridge"):
                st.markdown(f"**Fix:** {fix.text}")
            else:
                st.button(label, key=f"{key}:fix", on_click=apply_fix, args=(fix.to_json(),), type="primary")
            st.caption(plain(f"Fix proof: {fix.proof}"))


def _template_lines(model: LoadedModel, location: Location, around: int = 3) -> None:
    if location.line < 0:  # no line of the template is known
        return
    line = location.line
    end = location.end_line or line
    # The whole construct highlighted, with `around` lines either side.
    _excerpt_table(source_excerpt(model.renderer.source_lines(), line, around, end), line, end)


def _excerpt_table(excerpt: tuple[tuple[int, str], ...], line: int | None, end: int | None = None) -> None:
    _css()  # monospace, whitespace kept: the template's indentation shows its nesting
    last = end or line
    rows = "".join(
        f"<tr style='{'background:#fff8c5;font-weight:600' if line is not None and line <= n <= last else ''}'>"
        f"<td>{n}</td><td class='tok'>{html.escape(text)}</td></tr>" for n, text in excerpt)
    st.html(f"<table>{rows}</table>")


def error_card(cell: CellResult, model: LoadedModel) -> None:
    """An error cell: the failure's sentence, the template lines around it with a link, why, and the fix."""
    explained = explain_error(cell, model)
    st.error(plain(cell.note or cell.status))
    if explained is None:
        return
    with st.container(border=True):
        if explained.location:
            # The location names the template file, an upload's name among them: no backtick may end the code span.
            shown = f"`{explained.location}`" if "`" not in explained.location else plain(explained.location)
            where = f"[{shown}]({explained.url})" if explained.url else shown
            st.markdown(f"**Failed at** {where}")
            _excerpt_table(explained.excerpt, explained.line)
        st.markdown(f"**Why:** {explained.why}")
        st.markdown(f"**Fix:** {explained.fix}")


def boundaries_table(cell: CellResult) -> pd.DataFrame:
    return pd.DataFrame([{
        "boundary": b.index, "client appended": b.trigger, "holds": "✓" if b.holds else "✗",
        "chars kept": f"{b.string_prefix.common}/{b.string_prefix.prev_len}",
        "tokens kept": f"{b.token_prefix.common}/{b.token_prefix.prev_len}" if b.token_prefix else "—",
        "reused": b.reused_tokens, "prefill": b.prefill_tokens,
    } for b in cell.boundaries])


def show_cell(cell: CellResult, model: LoadedModel, apply_fix: Callable[[dict], None] | None, key: str,
              upload: dict | None = None) -> None:
    """The detail of one cell: figures, every boundary, the break side by side, the cause, exports (`upload`: a
    custom column's upload_json, carried by its evidence so that it replays)."""
    scenario = load_scenario(cell.scenario)
    model = cell_model(cell, model)  # as the cell's engine rendered it: the cause's lines are that renderer's
    st.subheader(f"{cell.model} × {cell.scenario} × {engine_spec(cell)}: {cell.status}")
    st.caption(f"{scenario.description} Model output: {scenario.knob_summary}. Template kwargs: "
               + (", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(cell.kwargs.items())) or "none"))
    if cell.renderer:
        st.caption(plain(f"Rendered by {cell.renderer}; request side: {cell.request_side}."))
    if cell.layers:
        st.caption(plain("Layers passed, client side first: " + " → ".join(cell.layers) + "."))
    if cell.status == "error":
        error_card(cell, model)
    elif cell.status == "unavailable":
        st.info(plain(cell.note or cell.status))
    elif cell.note:
        st.info(plain(cell.note))
    if len(cell.boundaries) > 1:
        st.dataframe(boundaries_table(cell), hide_index=True)
    breaking = [b for b in cell.boundaries if not b.holds]
    if breaking:
        choice = breaking[0]
        if len(breaking) > 1:
            index = st.selectbox("Boundary", [b.index for b in breaking], key=f"{key}:boundary")
            choice = next(b for b in breaking if b.index == index)
        cause_card(cell, model, apply_fix, key)
        show_break(model, choice, key)
    elif cell.boundaries:
        last = cell.boundaries[-1]
        st.success(f"Every boundary holds: the next prompt extends the previous sequence "
                   f"({last.reused_tokens if last.reused_tokens is not None else last.string_prefix.common} "
                   f"{'tokens' if last.reused_tokens is not None else 'chars'} reused at the last boundary).")
    export_buttons(cell, model, key, upload)


def export_buttons(cell: CellResult, model: LoadedModel, key: str, upload: dict | None = None) -> None:
    stem = re.sub(r"[^A-Za-z0-9._+-]", "-", f"{cell.model}_{cell.scenario}_{engine_spec(cell)}")
    cols = st.columns(3)
    try:
        evidence = json.dumps(cell_evidence(cell, model, upload=upload), ensure_ascii=False, indent=2)
        cols[0].download_button("Evidence JSON", evidence, f"{stem}.json", "application/json", key=f"{key}:json",
                                on_click="ignore")
        cols[1].download_button("Markdown", cell_markdown(cell, model), f"{stem}.md", "text/markdown",
                                key=f"{key}:md", on_click="ignore")
        cols[2].download_button("HTML page", evidence_html([cell], {cell.model: model}), f"{stem}.html", "text/html",
                                key=f"{key}:html", on_click="ignore")
    except BaseException as err:  # noqa: BLE001 - the exports fail alone (a panic too); the cell stays shown
        st.error(plain(f"Export failed: {describe_error(err)}"))
        return
    if upload is not None:
        carried = ", ".join(f["name"] for f in upload["files"].values() if "text" in f)
        st.caption(f"The evidence JSON carries {plain(carried)} (the upload's template text): `python -m engine "
                   "replay FILE` rebuilds this column anywhere.")


def describe_error(err: BaseException) -> str:
    """One sentence for the page; the rest of the app keeps working. Pages catch BaseException, because a Rust
    panic from a tokenizer (pyo3's PanicException) is one; anything else that is not an Exception (Streamlit's
    rerun and stop, KeyboardInterrupt) is raised again here."""
    if not (isinstance(err, Exception) or is_panic(err)):
        raise err
    return str(err) if isinstance(err, ExplorerError) else f"{type(err).__name__}: {err}"


# What makes Markdown, HTML or a Streamlit directive (`:red[...]`, `$math$`) of text; line-start markers such as
# "1." or "-" only change the layout, so they stay as they are.
_MARKDOWN_SYNTAX = re.compile(r"([\\`*_{}\[\]()<>!#|~$])")
# GFM links a bare "http://…", "www.…" or "a@b.org" in the text itself, escapes or not (remark-gfm works on the
# parsed text): an invisible word joiner (U+2060) before the ":", "." or "@" keeps each one text.
_AUTOLINK = re.compile(r"(?i)\b(https?|www)(?=[:.])|(?=@)")


def plain(text: str) -> str:
    """User-controlled text (file names, a template's raise_exception message) for a Markdown element, shown as
    the characters it holds: every Markdown, HTML and Streamlit directive character escaped, so an image or a link
    in it never renders and no viewer's browser fetches anything."""
    return _AUTOLINK.sub(lambda m: (m.group(1) or "") + "\u2060", _MARKDOWN_SYNTAX.sub(r"\\\1", text))


def kwarg_state_key(model_id: str, name: str) -> str:
    return f"kw:{model_id}:{name}"


def user_kwargs(model: LoadedModel) -> dict[str, Any]:
    """The template kwargs the user set away from the model's defaults (the toggles in the sidebar)."""
    out = {}
    for kwarg in model.spec.template_kwargs:
        value = st.session_state.get(kwarg_state_key(model.id, kwarg.name), kwarg.default)
        if value != kwarg.default:
            out[kwarg.name] = value
    return out


# The link's parameter that holds this visitor's workspace key (engine.workspace.visitor_workspace).
WORKSPACE_PARAM = "workspace"


class CustomColumn(NamedTuple):
    """An upload shown as a matrix column: its label, base model, and the workspace folder that holds it (this
    visitor's own, or the operator's shared one)."""

    label: str
    base_model: str
    workspace_root: str


def visitor_key() -> str:
    """This browser session's workspace key: the link's `workspace` parameter when it is one, else the session's, else
    a new one; written back into the link on every run (a page switch drops the link's parameters), so that a reload
    or a copied link opens the same uploads and traces."""
    param = st.query_params.get(WORKSPACE_PARAM)
    key = st.session_state.get("visitor_key")
    if param is not None and param != key:
        problem = visitor_key_problem(param)
        if problem is None:
            key = param
        elif key is None:
            st.warning(plain(f"The link's workspace key was not used ({problem}); this page has a new workspace of "
                             "its own."))
    if key is None:
        key = new_visitor_key()
    st.session_state.visitor_key = key
    if st.query_params.get(WORKSPACE_PARAM) != key:
        st.query_params[WORKSPACE_PARAM] = key
    return key


def own_workspace() -> Workspace:
    """This visitor's own workspace: what they upload and the traces they store, seen by nobody without their key."""
    workspace = visitor_workspace(visitor_key(), default_root())
    mark_used(workspace)
    _housekeeping(str(default_root()))
    return workspace


def shared_workspace() -> Workspace:
    """The operator's workspace ($DRIFT_WORKSPACE, the CLI's): its uploads are every visitor's, read-only here."""
    return Workspace(default_root(), read_only=True)


@st.cache_resource(show_spinner=False, ttl=3600, max_entries=4)
def _housekeeping(root: str) -> None:
    """When the server starts and then at most once an hour: idle visitor workspaces are deleted, and the operator's
    interrupted writes removed (not when it is read-only); said in the server's log."""
    for done in (expire_visitor_workspaces(root), Workspace(root).tidy()):
        if done:
            logging.getLogger(__name__).warning(done)


def init_custom_columns() -> None:
    """Once per browser session, on whichever page opens first: every upload of this visitor's workspace and of the
    operator's shared one is a matrix column again (after a reload or a restart); the Custom page can hide one."""
    if "custom_columns" in st.session_state:
        return
    columns: dict[str, CustomColumn] = {}
    st.session_state.custom_columns = columns
    for workspace in (shared_workspace(), own_workspace()):  # one's own upload wins over the same shared one
        try:
            listing = workspace.list()
        except BaseException as err:  # noqa: BLE001 - an unreadable workspace must not take the page down
            st.warning(plain(f"Stored uploads cannot be read: {describe_error(err)}"))
            continue
        columns.update({u.id: CustomColumn(u.label, u.base_model, str(workspace.root)) for u in listing.uploads})
