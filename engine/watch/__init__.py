"""`python -m engine watch`: a drift watch in front of a real OpenAI-compatible server.

proxy.py is the pass-through (an ASGI app under uvicorn on uvloop; connections.py reaches the upstream, reading its
responses with httptools' parser): it forwards every request unchanged and streams every response back byte for
byte, and hands each finished chat exchange, as one frame down a pipe, to the watch's analysis process (live.py, at a
lower CPU priority). There the recorder (record.py) writes it to the records file (an openai-jsonl line `python -m
engine trace` reads, with the upstream's own bytes) and offers it to the analysis through a bounded queue (dropped
with a counter when full): engine.traces' `TraceAnalysis`, the same as `trace`, one request at a time; it writes the
live state (live.json) and sends one event per request back, from which metrics.py keeps the Prometheus metrics.
upstream.py is a real local upstream that answers with recorded completions (the samples), for the tests and the
benchmark (overhead.py).
"""
