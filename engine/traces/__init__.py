"""Your own traffic: real agent traces and conversations, where their prefix cache broke, and why.

readers.py reads each format (auto-detected, streamed line by line for the logs) into `TraceRequest`s;
truth.py groups them into sessions and computes every step's ground truth with engine.session's accounting;
why.py replays each break through the pipeline (pipeline.py) and attributes it as a matrix cell does;
report.py puts it together (`analyse_trace`) for `python -m engine trace` and the "Your traffic" page.
"""
