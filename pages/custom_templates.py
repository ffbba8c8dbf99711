"""Upload a chat template (and optionally a tokenizer) for a model's output format; it becomes a matrix column."""

from __future__ import annotations

import math

import streamlit as st

from engine.models import default_model_ids, load_spec
from engine.uploads import UploadLimits
from engine.workspace import Workspace
from pages.common import describe_error, init_custom_columns, workspace_root


def _megabytes(size: int) -> int:
    """A byte cap as the whole megabytes the uploader shows (rounded up: validation refuses the excess exactly)."""
    return max(1, math.ceil(size / (1024 * 1024)))


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
    with st.spinner("Validating in the sandbox…"):
        try:
            upload = workspace.add(base, files, label.strip() or None)
        except Exception as err:  # noqa: BLE001 - every rejection is shown as its sentence; nothing else is lost
            st.error(describe_error(err))
            return
    st.session_state.custom_columns[upload.id] = (upload.label, upload.base_model)
    st.success(f"Stored as {upload.id[:12]} in {workspace.root}; it is now a column next to {upload.base_model} "
               "in the matrix.")


def _listing(workspace: Workspace) -> None:
    try:
        listing = workspace.list()
    except Exception as err:  # noqa: BLE001
        st.error(f"The workspace {workspace.root} cannot be read: {describe_error(err)}")
        return
    uploads = listing.uploads
    for problem in listing.skipped:  # a half-written or corrupt entry is reported, never fatal
        st.warning(problem)
    if not uploads:
        st.info("No uploads yet.")
        return
    shown = st.session_state.custom_columns
    for upload in uploads:
        with st.container(border=True):
            cols = st.columns([5, 2, 1])
            files = ", ".join(f"{role}: {name}" for role, name in upload.original_names.items())
            cols[0].markdown(f"**{upload.base_model}+{upload.label}** · `{upload.id[:12]}` · {files}")
            in_matrix = cols[1].checkbox("show in matrix", value=upload.id in shown, key=f"show:{upload.id}")
            if in_matrix:
                shown[upload.id] = (upload.label, upload.base_model)
            else:
                shown.pop(upload.id, None)
            if cols[2].button("Remove", key=f"remove:{upload.id}"):
                try:
                    workspace.remove(upload.id)
                    shown.pop(upload.id, None)
                    st.rerun()
                except Exception as err:  # noqa: BLE001
                    st.error(describe_error(err))


def main() -> None:
    st.title("Custom templates")
    st.caption("Your template runs in a sandboxed worker process with time, output, recursion and memory limits. "
               "Uploads are validated, stored by content hash and kept across restarts.")
    # The matrix's columns are the stored uploads, whichever page this browser session opened first.
    init_custom_columns()
    root = st.text_input("Workspace folder", value=workspace_root(), help="Set DRIFT_WORKSPACE to change the default.")
    st.session_state.workspace_root = root
    workspace = Workspace(root)
    _upload_form(workspace)
    st.subheader("Stored uploads")
    _listing(workspace)


main()
