"""Upload a chat template (and optionally a tokenizer) for a model's output format; it becomes a matrix column."""

from __future__ import annotations

import math

import streamlit as st

from engine.models import default_model_ids, load_spec
from engine.uploads import UploadLimits
from engine.workspace import READ_ONLY_ENV, WORKSPACE_ENV, Upload, Workspace
from pages.common import describe_error, init_custom_columns, plain, through_the_app


def _megabytes(size: int) -> int:
    """A byte cap as the whole megabytes the uploader shows (rounded up: validation refuses the excess exactly)."""
    return max(1, math.ceil(size / (1024 * 1024)))


def _workspace() -> Workspace:
    """The folder is the operator's setting (DRIFT_WORKSPACE), never a visitor's."""
    return Workspace()


@st.cache_resource(show_spinner=False)
def _tidied(root: str) -> str | None:
    """Interrupted writes are removed once per server process; the sentence is shown from then on."""
    return Workspace(root).tidy()


def _uploader() -> str:
    """Who uploads, as far as the app knows: the signed-in user, else the visitor's address."""
    try:
        if st.user.is_logged_in:
            return str(st.user.get("email") or st.user.get("name") or "a signed-in user")
    except Exception:  # noqa: BLE001 - no authentication configured
        pass
    address = st.context.ip_address
    return f"a visitor from {address}" if isinstance(address, str) and address else "an anonymous visitor"


def _upload_form(workspace: Workspace) -> None:
    limits = UploadLimits.from_env()  # the caps validation enforces, shown on each uploader instead of "200MB"
    with st.form("upload", clear_on_submit=False):
        template = st.file_uploader("Chat template: a .jinja file or a tokenizer_config.json",
                                    type=["jinja", "j2", "json", "txt"], key="upload:template",
                                    max_upload_size=_megabytes(limits.max_text_bytes))
        tokenizer = st.file_uploader("Optional tokenizer: tokenizer.json, or Kimi's tiktoken.model",
                                     type=["json", "model"], key="upload:tokenizer",
                                     max_upload_size=_megabytes(limits.max_tokenizer_bytes))
        base = st.selectbox("Output format and engine parsers of", default_model_ids(), key="upload:base",
                            format_func=lambda m: f"{m} ({load_spec(m).family})")
        label = st.text_input("Label (the matrix column is named model+label)", value="custom", key="upload:label")
        submitted = st.form_submit_button("Upload and validate", type="primary")
    if not submitted:
        return
    if template is None:
        st.error("Choose a template file first.")
        return
    files = {}
    name = template.name
    files["tokenizer_config" if name.endswith(".json") else "chat_template"] = (name, template.getvalue())
    if tokenizer is not None:
        role = "tiktoken" if tokenizer.name.endswith(".model") else "tokenizer"
        files[role] = (tokenizer.name, tokenizer.getvalue())
    with st.spinner("Validating in the sandbox (every scenario)…"):
        try:
            upload = workspace.add(base, files, label.strip() or None, uploader=_uploader())
        except BaseException as err:  # noqa: BLE001 - every rejection is shown as its sentence; nothing else is lost
            st.error(plain(describe_error(err)))
            return
    st.session_state.custom_columns[upload.id] = (upload.label, upload.base_model)
    # The listing's checkbox below would otherwise keep an earlier "hidden" choice for this very upload.
    st.session_state[f"show:{upload.id}"] = True
    st.success(plain(f"Stored as {upload.id[:12]} ({upload.model_id}); it is now a column next to "
                     f"{upload.base_model} in the matrix."))


def _describe(upload: Upload) -> str:
    files = ", ".join(f"{role}: {name}" for role, name in upload.original_names.items())
    who = f" by {upload.uploader}" if upload.uploader else ""
    return f"{upload.model_id} · {upload.id[:12]} · uploaded {upload.created}{who} · {files}"


def _listing(workspace: Workspace) -> None:
    try:
        listing = workspace.list()
    except BaseException as err:  # noqa: BLE001
        st.error(plain(f"The workspace cannot be read: {describe_error(err)}"))
        return
    uploads = listing.uploads
    if listing.skipped:  # damaged or unfinished entries are reported, never fatal, and never one box each
        st.warning(plain(listing.skipped[0]) if len(listing.skipped) == 1 else
                   f"{len(listing.skipped)} problems in the workspace; the intact uploads are listed below.")
        if len(listing.skipped) > 1:
            with st.expander("What was skipped"):
                st.text("\n".join(listing.skipped[:200]))
    if not uploads:
        st.info("No uploads yet.")
        return
    shown = st.session_state.custom_columns
    for upload in uploads:
        with st.container(border=True):
            cols = st.columns([5, 2, 1])
            cols[0].markdown(plain(_describe(upload)))
            in_matrix = cols[1].checkbox("show in matrix", value=upload.id in shown, key=f"show:{upload.id}")
            if in_matrix:
                shown[upload.id] = (upload.label, upload.base_model)
            else:
                shown.pop(upload.id, None)
            if not workspace.read_only and cols[2].button("Remove", key=f"remove:{upload.id}"):
                try:
                    workspace.remove(upload.id)
                    shown.pop(upload.id, None)
                    st.rerun()
                except BaseException as err:  # noqa: BLE001 - a panic too
                    st.error(plain(describe_error(err)))


def main() -> None:
    st.title("Custom templates")
    st.caption("Your template runs in a sandboxed worker process with time, output, recursion and memory limits. "
               "Uploads are validated on every scenario, stored by content hash and kept across restarts; every "
               "visitor of this server sees them.")
    # The matrix's columns are the stored uploads, whichever page this browser session opened first.
    init_custom_columns()
    workspace = _workspace()
    st.caption(plain(f"Workspace: {workspace.root} (the operator sets it with {WORKSPACE_ENV})."))
    tidied = _tidied(str(workspace.root))
    if tidied:
        st.info(plain(tidied))
    if workspace.read_only:
        st.info(f"This workspace is read-only ({READ_ONLY_ENV}): uploads and removal are turned off here.")
    else:
        _upload_form(workspace)
    st.subheader("Stored uploads")
    _listing(workspace)


through_the_app()
main()
