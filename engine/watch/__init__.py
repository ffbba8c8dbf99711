"""`python -m engine watch`: a drift watch in front of a real OpenAI-compatible server.

proxy.py is the pass-through (an ASGI app under uvicorn, httpx to the upstream): it forwards every request unchanged
and streams every response back byte for byte, and hands each finished chat exchange to its recorder thread, which
writes it to the records file (record.py: an openai-jsonl line `python -m engine trace` reads, with the upstream's
own bytes) and then offers it to the analysis through a bounded queue (dropped with a counter when full). The
analysis (live.py) runs in a process of its own, off the request path: engine.traces' `TraceAnalysis`, the same as
`trace`, one request at a time; it writes the live state (live.json) and sends one span-like event per request
back, from which metrics.py keeps the Prometheus metrics. upstream.py is a real local upstream that answers with
recorded completions (the samples), for the tests and the benchmark.
"""
