"""Upload a chat template (and optionally a tokenizer) for a model's output format; it becomes a matrix column."""

from __future__ import annotations

import math

import streamlit as st

from engine.models import default_model_ids, load_spec
from engine.uploads import UploadLimits
from engine.workspace import READ_ONLY_ENV, WORKSPACE_ENV, Upload, Workspace, disk_used
from pages.common import (
    CustomColumn,
    describe_error,
    init_custom_columns,
    own_workspace,
    plain,
    shared_workspace,
    through_the_app,
)


def _megabytes(size: int) -> int:
    """A byte cap as the whole megabytes the uploader shows (rounded up: validation refuses the excess exactly)."""
    return max(1, math.ceil(size / (1024 * 1024)))


def _tidied(workspace: Workspace) -> str | None:
    """Interrupted writes in this visitor's workspace are removed once per browser session."""
    if "custom:tidied" not in st.session_state:
        st.session_state["custom:tidied"] = workspace.tidy()
    return st.session_state["custom:tidied"]


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
    st.session_state.custom_columns[upload.id] = CustomColumn(upload.label, upload.base_model, str(workspace.root))
    # The listing's checkbox below would otherwise keep an earlier "hidden" choice for this very upload.
    st.session_state[f"show:{upload.id}"] = True
    st.success(plain(f"Stored as {upload.id[:12]} ({upload.model_id}); it is now a column next to "
                     f"{upload.base_model} in the matrix."))


def _describe(upload: Upload) -> str:
    files = ", ".join(f"{role}: {name}" for role, name in upload.original_names.items())
    who = f" by {upload.uploader}" if upload.uploader else ""
    return f"{upload.model_id} · {upload.id[:12]} · uploaded {upload.created}{who} · {files}"


def _listing(workspace: Workspace, title: str, empty: str | None, caption: str = "",
             listed: frozenset[str] = frozenset()) -> frozenset[str]:
    """The uploads of one workspace under `title`, each with its "show in matrix" box (and Remove where the workspace
    is writable), but those already `listed` (the same files stored twice: one column); `empty`: what to say when it
    holds none (None: show nothing then). Returns the ids listed, `listed` included."""
    try:
        listing = workspace.list()
    except BaseException as err:  # noqa: BLE001
        st.error(plain(f"The workspace cannot be read: {describe_error(err)}"))
        return listed
    uploads = [u for u in listing.uploads if u.id not in listed]
    listed = listed | {u.id for u in uploads}
    if not uploads and empty is None:
        return listed
    st.subheader(title)
    if caption:
        st.caption(plain(caption))
    if listing.skipped:  # damaged or unfinished entries are reported, never fatal, and never one box each
        st.warning(plain(listing.skipped[0]) if len(listing.skipped) == 1 else
                   f"{len(listing.skipped)} problems in the workspace; the intact uploads are listed below.")
        if len(listing.skipped) > 1:
            with st.expander("What was skipped"):
                st.text("\n".join(listing.skipped[:200]))
    if not uploads:
        if empty:
            st.info(empty)
        return listed
    shown = st.session_state.custom_columns
    for upload in uploads:
        with st.container(border=True):
            cols = st.columns([5, 2, 1])
            cols[0].markdown(plain(_describe(upload)))
            in_matrix = cols[1].checkbox("show in matrix", value=upload.id in shown, key=f"show:{upload.id}")
            if in_matrix:
                shown[upload.id] = CustomColumn(upload.label, upload.base_model, str(workspace.root))
            else:
                shown.pop(upload.id, None)
            if not workspace.read_only and cols[2].button("Remove", key=f"remove:{upload.id}"):
                try:
                    workspace.remove(upload.id)
                    shown.pop(upload.id, None)
                    st.rerun()
                except BaseException as err:  # noqa: BLE001 - a panic too
                    st.error(plain(describe_error(err)))
    return listed


def main() -> None:
    st.title("Custom templates")
    st.caption("Your template runs in a sandboxed worker process with time, output, recursion and memory limits. "
               "Uploads are validated on every scenario, stored by content hash and kept across restarts.")
    # The matrix's columns are the stored uploads, whichever page this browser session opened first.
    init_custom_columns()
    workspace = own_workspace()
    limits = workspace.visitor_limits
    assert limits is not None
    used = disk_used(workspace.root) if workspace.root.is_dir() else 0
    st.caption(f"Your uploads and traces are yours alone: they belong to this page's link (its `workspace` "
               f"parameter), so a reload or the link bookmarked brings them back, and whoever you give the link to "
               f"sees them; nobody else does. {used / 2**20:.2f} of {limits.max_mb} MB used; a workspace unused for "
               f"{limits.idle_days} days is deleted.")
    tidied = _tidied(workspace)
    if tidied:
        st.info(plain(tidied))
    if workspace.read_only:
        st.info(f"This server is read-only ({READ_ONLY_ENV}): uploads and removal are turned off here.")
    else:
        _upload_form(workspace)
    own = _listing(workspace, "Your uploads", "No uploads yet.")
    _listing(shared_workspace(), "Shared by the operator", None,
             f"Every visitor sees these, read-only: {shared_workspace().root} (the operator's workspace, "
             f"{WORKSPACE_ENV}; python -m engine uses it).", own)


through_the_app()
main()
