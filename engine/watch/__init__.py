"""`python -m engine watch`: a drift watch in front of a real OpenAI-compatible server.

proxy.py is the pass-through (an ASGI app under uvicorn on uvloop, one thread; connections.py reaches the upstream,
reading its responses with httptools' parser): it forwards every request unchanged and streams every response back
byte for byte, and hands each finished chat exchange, as one frame down a pipe, to the watch's recorder process
(recorder.py, nice 10). There `Recorder` (record.py) writes it to the records file (an openai-jsonl line `python -m
engine trace` reads, with the upstream's own bytes) and offers it through a bounded queue (dropped with a counter
when full) to the analysis process (live.py, SCHED_IDLE): engine.traces' `TraceAnalysis`, the same as `trace`, one
request at a time; it writes the live state (live.json) and sends one event per request back, from which the
recorder keeps the Prometheus metrics (metrics.py) and the status.
upstream.py is a real local upstream that answers with recorded completions (the samples), for the tests and the
benchmark (overhead.py).
"""
