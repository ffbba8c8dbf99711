"""The watch's Prometheus metrics (prometheus-client, a registry of its own per watch), kept by the recorder process
from the lines it writes and the analysis' span-like events (the proxy adds its own two: proxy.py's ProxyMetrics).

Names: `drift_watch_*` for what only this project measures; the OpenTelemetry GenAI semantic conventions' names
where they have one, written as Prometheus writes OpenTelemetry names (dots as underscores): the token histogram
`gen_ai_client_token_usage` with `gen_ai_token_type` input / output, and the labels `gen_ai_request_model`,
`gen_ai_provider_name`. No OpenTelemetry SDK is imported: the span attributes (live.py) carry the gen_ai.* names
as they are, for a collector to map.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics

from engine.watch.record import OUTCOMES

TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)


class WatchMetrics:
    def __init__(self, model: str, engine: str | None, upstream: str) -> None:
        disable_created_metrics()  # no *_created series beside each counter (process-wide, as the library has it)
        self.registry = CollectorRegistry()
        r = self.registry
        Info("drift_watch", "what this watch stands in front of", registry=r).info(
            {"gen_ai_request_model": model, "gen_ai_provider_name": (engine or "").partition("@")[0],
             "engine": engine or "", "upstream": upstream})
        self.requests = Counter("drift_watch_requests", "chat requests passed through, by how they ended",
                                ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.dropped = Counter("drift_watch_analysis_dropped", "recorded exchanges the analysis never saw: its "
                               "queue was full (still in the records file)", registry=r)
        self.queued = Gauge("drift_watch_analysis_queue", "recorded exchanges waiting for the analysis", registry=r)
        self.analysed = Counter("drift_watch_analysed_requests", "requests the analysis has computed", registry=r)
        self.errors = Counter("drift_watch_analysis_errors", "requests the analysis could not compute", registry=r)
        self.sessions = Counter("drift_watch_sessions", "sessions seen", registry=r)
        self.reused = Counter("drift_watch_reused_tokens", "prompt tokens the prefix cache can reuse (token level, "
                              "from the session's own history)", registry=r)
        self.prefilled = Counter("drift_watch_prefill_tokens", "prompt tokens prefilled again", registry=r)
        self.lost = Counter("drift_watch_lost_tokens", "tokens of cache lost at breaks: earlier sequences' tokens "
                            "past the first differing token", registry=r)
        self.breaks = Counter("drift_watch_breaks", "prompts that part from the previous request's sequence, by "
                              "cause", ["stage", "kind", "location"], registry=r)
        self.cached = Counter("drift_watch_cached_tokens", "cached prompt tokens where the upstream reports them "
                              "(usage.prompt_tokens_details.cached_tokens): measured, and predicted from the "
                              "session's history at the block size", ["source"], registry=r)
        self.disagreements = Counter("drift_watch_cache_disagreements", "requests whose measured cached tokens "
                                     "differ from the prediction: below (the server lost what the session should "
                                     "have kept) or above (a prefix shared with other sessions)", ["direction"],
                                     registry=r)
        for label in ("measured", "predicted"):
            self.cached.labels(label)
        for label in ("below", "above"):
            self.disagreements.labels(label)
        self.token_usage = Histogram("gen_ai_client_token_usage", "gen_ai.client.token.usage: tokens per request",
                                     ["gen_ai_token_type", "gen_ai_operation_name", "gen_ai_request_model"],
                                     buckets=TOKEN_BUCKETS, registry=r)

    def observe(self, event: dict[str, Any]) -> None:
        """One event of the analysis (live.py)."""
        if event.get("type") == "error":
            self.errors.inc()
            return
        if event.get("type") != "span":
            return
        a = event["attributes"]
        self.analysed.inc()
        if event.get("new_session"):
            self.sessions.inc()
        self.reused.inc(a["drift.prefix.reused_tokens"])
        self.prefilled.inc(a["drift.prefix.prefill_tokens"])
        model = a.get("gen_ai.request.model") or ""
        self.token_usage.labels("input", "chat", model).observe(a["gen_ai.usage.input_tokens"])
        if a.get("gen_ai.usage.output_tokens") is not None:
            self.token_usage.labels("output", "chat", model).observe(a["gen_ai.usage.output_tokens"])
        if "drift.break.token" in a:
            self.lost.inc(a["drift.prefix.lost_tokens"])
            location = a["drift.break.location"]
            if a["drift.break.stage"] == "client":  # the client's record ("openai-jsonl:line 12:0"): one label
                location = location.split(":", 1)[0]
            self.breaks.labels(a["drift.break.stage"], a["drift.break.kind"], location).inc()
        if "gen_ai.usage.cache_read.input_tokens" in a:
            measured, predicted = a["gen_ai.usage.cache_read.input_tokens"], a["drift.cache.predicted_tokens"]
            self.cached.labels("measured").inc(measured)
            self.cached.labels("predicted").inc(predicted)
            if measured != predicted:
                self.disagreements.labels("below" if measured < predicted else "above").inc()
