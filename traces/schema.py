"""The canonical trace schema (docs/architecture.md, Trace schema): one row per request.

Everything else in `traces` (readers, importers, generators, transforms) produces
tables that conform to `TRACE_SCHEMA`; the runner consumes only this.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    required: bool
    nullable: bool
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("arrival_ns", pa.int64(), True, False, "ns since the trace origin"),
    Column("input_tokens", pa.int32(), True, False, "prompt length in tokens"),
    Column("output_tokens", pa.int32(), True, True, "tokens to generate; null = server decides"),
    Column("request_id", pa.string(), False, False, "unique; row index when absent"),
    Column("model", pa.dictionary(pa.int32(), pa.string()), False, True, "trace-side model label"),
    Column("session_id", pa.string(), False, True, "conversation grouping"),
    Column("turn", pa.int32(), False, True, "0-based turn within the session"),
    Column("parent_id", pa.string(), False, True, "parent request in a conversation tree"),
    Column("hash_ids", pa.list_(pa.int64()), False, True, "prefix block ids (block_size tokens each)"),
    Column("slo_class", pa.string(), False, True, "SLO class of the request"),
    Column("api", pa.string(), False, True, "completions or chat"),
    Column("prompt", pa.string(), False, True, "real prompt text, sent verbatim"),
    Column("failed_in_source", pa.bool_(), False, True, "source marked the request failed"),
    Column("observed_latency_s", pa.float64(), False, True, "latency observed in the source"),
    Column("client_id", pa.string(), False, True, "originating client / tenant"),
    Column("num_images", pa.int16(), False, True, "images sent with the request (0..64); null = none"),
    Column("image_px", pa.string(), False, True, "image size WxH in pixels; null = 512x512"),
    Column("reasoning_tokens", pa.int32(), False, True,
           "of output_tokens, how many are reasoning (<= output_tokens); null = not said"),
    Column("task_id", pa.string(), False, True, "agentic task (graph of calls); needed with depends_on"),
    Column("depends_on", pa.list_(pa.string()), False, True,
           "request_ids of earlier rows of the same task that must complete before this row is sent"),
    Column("delay_s", pa.float64(), False, True, "tool/think time after the last dependency completes; null = 0"),
    Column("extra", pa.string(), False, True, "unknown source columns as JSON"),
)

# Images (multimodal requests). More than 64 images in one chat request is absurd: such a
# count is a mapping or unit mistake, and replay would build that many image parts per
# request. 8192 px a side bounds one image the same way (8192x8192 RGB is 200 MB raw).
MAX_IMAGES = 64
MAX_IMAGE_SIDE = 8192
# Tokens per request: input_tokens and output_tokens are each at most 2^24 = 16,777,216, above
# the longest context windows served today (1M-10M tokens); a larger count is a unit or mapping
# mistake (bytes for tokens), and replay would build a prompt of that many tokens. validate
# enforces it (`trace.conform`), generate caps at it.
MAX_TOKENS = 1 << 24
DEFAULT_IMAGE_PX = "512x512"       # what replay sends for a row with images and no image_px
IMAGE_PX_PATTERN = r"^\d+x\d+$"

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)
TRACE_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])

def schema_for(names: list[str]) -> pa.Schema:
    """The canonical schema restricted to `names`, in canonical column order."""
    return pa.schema([TRACE_SCHEMA.field(n) for n in TRACE_SCHEMA.names if n in names])
