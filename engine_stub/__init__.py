"""The reference target: a small vLLM in torch (paged KV cache, continuous batching,
preemption, prefix caching) behind an OpenAI-compatible server with vLLM's metrics.

Imports nothing from traces/replay/reports; they reach it only over HTTP.
"""
