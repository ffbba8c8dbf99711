"""The drift-matrix explorer: `streamlit run app.py`. Thin: every page only calls the `engine` library."""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="Drift matrix explorer", layout="wide")

navigation = st.navigation([
    st.Page("pages/matrix.py", title="Drift matrix", icon=":material/grid_on:", default=True, url_path="matrix"),
    st.Page("pages/custom_templates.py", title="Custom templates", icon=":material/upload_file:", url_path="custom"),
    st.Page("pages/session.py", title="Agent session", icon=":material/timeline:", url_path="session"),
    st.Page("pages/traffic.py", title="Your traffic", icon=":material/query_stats:", url_path="traffic"),
])
navigation.run()
