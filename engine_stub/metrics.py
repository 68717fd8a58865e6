"""Prometheus metrics with vLLM's names, types and `model_name` label.

Gauges are set by the engine thread after every step; histograms are observed where tokens are
produced (the engine thread), never in the HTTP layer.
"""
from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics,
                               generate_latest)

disable_created_metrics()  # as vLLM: no *_created series

# vLLM's latency buckets, with finer ones below 10 ms (a CPU engine's inter-token gaps live there)
_FINE = [0.001, 0.0025, 0.005, 0.0075]
TTFT_BUCKETS = _FINE + [0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = _FINE + [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = _FINE + [0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                           20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKEN_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FINISH_REASONS = ("stop", "length", "abort")


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)  # process_start_time_seconds (the engine's uptime), CPU, memory: as vLLM's
        L = ["model_name"]
        g = lambda name, doc: Gauge(name, doc, L, registry=r)  # noqa: E731
        c = lambda name, doc: Counter(name, doc, L, registry=r)  # noqa: E731
        h = lambda name, doc, b: Histogram(name, doc, L, buckets=b, registry=r)  # noqa: E731
        self.running = g("vllm:num_requests_running", "Requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Requests waiting to be processed.")
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.prefix_queries = c("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               L + ["finished_reason"], registry=r)
        self.iteration_tokens = h("vllm:iteration_tokens_total", "Tokens per engine step.", TOKEN_BUCKETS)
        self.ttft = h("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", REQUEST_BUCKETS)
        self.queue = h("vllm:request_queue_time_seconds", "Time spent in WAITING phase.", REQUEST_BUCKETS)
        self.prefill = h("vllm:request_prefill_time_seconds", "Time spent in PREFILL phase.", REQUEST_BUCKETS)
        self.decode = h("vllm:request_decode_time_seconds", "Time spent in DECODE phase.", REQUEST_BUCKETS)
        self.prompt_len = h("vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.gen_len = h("vllm:request_generation_tokens", "Generation tokens per request.", TOKEN_BUCKETS)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """The children of every metric for one `model_name`, resolved once (labels() is slowish)."""

    def __init__(self, m: Metrics, name: str) -> None:
        for attr, metric in vars(m).items():
            if attr not in ("registry", "success"):
                setattr(self, attr, metric.labels(name))
        self.success = {reason: m.success.labels(name, reason) for reason in FINISH_REASONS}
