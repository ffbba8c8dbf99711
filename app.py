"""The drift-matrix explorer: `streamlit run app.py`. Thin: every page only calls the `engine` library."""

from __future__ import annotations

import streamlit as st

from pages.common import visitor_key

# An emoji favicon: the pages' material icons would make the browser fetch one from fonts.gstatic.com (offline here).
st.set_page_config(page_title="Drift matrix explorer", page_icon="📊", layout="wide")

MATRIX = "pages/matrix.py"
navigation = st.navigation([
    # The default page lives at "/"; its own url_path only names it internally.
    st.Page(MATRIX, title="Drift matrix", icon=":material/grid_on:", default=True, url_path="drift-matrix"),
    st.Page("pages/custom_templates.py", title="Custom templates", icon=":material/upload_file:", url_path="custom"),
    st.Page("pages/session.py", title="Agent session", icon=":material/timeline:", url_path="session"),
    st.Page("pages/traffic.py", title="Your traffic", icon=":material/query_stats:", url_path="traffic"),
    st.Page("pages/watch.py", title="Live watch", icon=":material/monitoring:", url_path="watch"),
    st.Page("pages/zoo.py", title="Template zoo", icon=":material/pets:", url_path="zoo"),
    # /matrix (the name the page goes by) opens the matrix too, with its query parameters, instead of Streamlit's
    # "Page not found" dialog: the default page is only reachable at "/".
    st.Page(MATRIX, title="Drift matrix", url_path="matrix", visibility="hidden"),
    # Each page also under its file's name, the name Streamlit's legacy pages/ mode gives it: a session that mode
    # started on a page reruns through this navigation onto the same page (pages.common.through_the_app).
    st.Page("pages/custom_templates.py", title="Custom templates", url_path="custom_templates", visibility="hidden"),
])
# Every run of every page keeps this visitor's workspace key in the link (a page switch drops the link's parameters).
visitor_key()
navigation.run()
