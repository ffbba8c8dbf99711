"""Your own traffic: real agent traces and conversations, where their prefix cache broke, and why.

readers.py reads each format (auto-detected, streamed line by line for the logs) into `TraceRequest`s (records.py);
grouping.py groups them into sessions, one per conversation; truth.py computes every step's ground truth with
engine.session's accounting; why.py replays each break through the pipeline (pipeline.py) and has engine.blame
attribute it as for a matrix cell; report.py does it in one pass (`analyse_trace`) for `python -m engine trace` and
the "Your traffic" page; evidence.py is a step's break view and the exports; store.py keeps uploaded traces in the
workspace.
"""
