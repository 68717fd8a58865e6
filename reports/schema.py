"""The records schema (docs/architecture.md, Records schema): one row per replayed trace row.

`reports` owns it; `replay` writes it; anything that reads a run (reports, compare,
gates, importers of other tools' outputs) relies only on this.
All times are seconds relative to the run's t0 (float64), except `token_times`,
which are float32 seconds relative to `sent_s`: one per chunk carrying generated tokens of any
kind: the reasoning phase (`token_times[:reasoning_chunks]`), then the answer. `connect_s` is a
duration (float32 seconds), not a time: how long the request's new connection took to open (TCP
connect, plus the TLS handshake for https); null when it was sent on a kept-alive connection
(or never got one). Older files without it read as all null.
"""
from __future__ import annotations

import pyarrow as pa

# Versions: 2: first_answer_s, reasoning_tokens, reasoning_chunks, num_images (v1 files read as without
# reasoning and images); 3: connect_s (older files: not recorded); 4: target (older files: null, the
# run's one target); 5: end_s, task_id, depends_on, delay_s, cached_tokens (older files: null, no task
# graph); 6: asked_reasoning_tokens (older files: null); 7: trace_id (older files: null, not traced);
# 8: client_id (older files: null, no tenant)
RECORDS_SCHEMA_VERSION = 8

STATUSES = ("ok", "http_error", "timeout", "connection_error", "protocol_error",
            "cancelled", "not_sent", "dependency_failed")

# The records layout, one line a field in file order: (field, the trace-row column a record of a row
# that was never sent takes it from; None: null, or set by replay: target, worker, status, error).
# RECORD_SCHEMA, `replay.recorder.record`'s order and the not-sent records derive from it.
RECORD_LAYOUT = (
    (pa.field("request_id", pa.string(), nullable=False), "request_id"),
    (pa.field("model", pa.string()), "model"),  # trace-side label
    (pa.field("target_model", pa.string()), None),  # served model it was mapped to
    (pa.field("target", pa.string()), None),  # base URL of the deployment it was sent to
    (pa.field("slo_class", pa.string()), "slo_class"),
    (pa.field("session_id", pa.string()), "session_id"),
    (pa.field("worker", pa.int32()), None),
    (pa.field("scheduled_s", pa.float64()), "scheduled_s"),
    (pa.field("sent_s", pa.float64()), None),  # null when not sent
    (pa.field("connect_s", pa.float32()), None),  # seconds to open its connection (TCP + TLS); null: reused one
    (pa.field("first_token_s", pa.float64()), None),  # first generated token of any kind (answer or reasoning)
    (pa.field("last_token_s", pa.float64()), None),
    (pa.field("end_s", pa.float64()), None),  # the response ended: last byte read, error or deadline
    (pa.field("first_answer_s", pa.float64()), None),  # first answer token (text or tool call), after any reasoning
    (pa.field("token_times", pa.list_(pa.float32())), None),
    (pa.field("chunk_tokens", pa.list_(pa.int16())), None),
    (pa.field("input_tokens", pa.int32()), "input_tokens"),
    (pa.field("output_tokens", pa.int32()), "output_tokens"),
    (pa.field("num_images", pa.int16()), "num_images"),  # images sent with the request (the trace's num_images)
    (pa.field("prompt_tokens", pa.int32()), None),
    (pa.field("completion_tokens", pa.int32()), None),
    (pa.field("reasoning_tokens", pa.int32()), None),  # usage's if reported (> 0), else reasoning chunks; null: none
    (pa.field("reasoning_chunks", pa.int32()), None),  # chunks before the first answer (all when none came); null: 0
    (pa.field("status", pa.string(), nullable=False), None),
    (pa.field("http_status", pa.int32()), None),
    (pa.field("error", pa.string()), None),
    (pa.field("task_id", pa.string()), "task_id"),  # agentic task of the row (trace task_id)
    (pa.field("depends_on", pa.list_(pa.string())), "depends_on"),  # rows it waited for (trace depends_on)
    (pa.field("delay_s", pa.float32()), "delay_s"),  # tool/think time it waited after them (capped by --max-delay)
    (pa.field("cached_tokens", pa.int32()), None),  # usage.prompt_tokens_details.cached_tokens; null: not reported
    (pa.field("asked_reasoning_tokens", pa.int32()), "reasoning_tokens"),  # what the trace asked for (reasoning_tokens: what came)
    (pa.field("trace_id", pa.string()), None),  # W3C trace id sent in its traceparent (32 hex); null: not traced
    (pa.field("client_id", pa.string()), "client_id"),  # the trace's tenant, sent as the body's `user`
)
RECORD_SCHEMA = pa.schema([f for f, _ in RECORD_LAYOUT])

# Server spans (spans.parquet, `replay run --otlp`): one row per received span that carries a
# request's server-side latencies (vLLM's `llm_request`: gen_ai.latency.* in seconds). Durations
# come from the server's attributes, never from subtracting its clock from the client's.
SPANS_SCHEMA = pa.schema([
    pa.field("trace_id", pa.string(), nullable=False),   # 32 lowercase hex: joins records.trace_id
    pa.field("span_id", pa.string()),
    pa.field("name", pa.string()),
    pa.field("service", pa.string()),                    # resource service.name
    pa.field("start_s", pa.float64()),                   # span start/end on the server's clock,
    pa.field("end_s", pa.float64()),                     # relative to the run's t0_wall
    pa.field("received_s", pa.float64()),                # when the receiver got it (rel. t0); null: from a file
    pa.field("server_request_id", pa.string()),          # gen_ai.request.id
    pa.field("queue_s", pa.float64()),                   # gen_ai.latency.time_in_queue
    pa.field("ttft_s", pa.float64()),                    # gen_ai.latency.time_to_first_token
    pa.field("e2e_s", pa.float64()),                     # gen_ai.latency.e2e
    pa.field("prefill_s", pa.float64()),                 # gen_ai.latency.time_in_model_prefill
    pa.field("decode_s", pa.float64()),                  # gen_ai.latency.time_in_model_decode
    pa.field("inference_s", pa.float64()),               # gen_ai.latency.time_in_model_inference
    pa.field("prompt_tokens", pa.int32()),               # gen_ai.usage.prompt_tokens
    pa.field("completion_tokens", pa.int32()),           # gen_ai.usage.completion_tokens
])

# Scraped Prometheus samples (server_metrics.parquet): one row per sample.
SERVER_METRICS_SCHEMA = pa.schema([
    pa.field("time_s", pa.float64(), nullable=False),   # relative to the run's t0
    pa.field("name", pa.string(), nullable=False),      # sample name, e.g. vllm:num_requests_running
    pa.field("labels", pa.string()),                    # JSON object of labels
    pa.field("value", pa.float64()),
])
