"""The trace: schema, read/write, validate, import, generate, fit, transform, describe.

Depends only on pyarrow/numpy (and scipy/pandas for statistics); never on replay or reports.
"""
from .errors import TraceError
from .schema import COLUMNS, SCHEMA_VERSION, TRACE_SCHEMA
from .trace import Trace, conform

__all__ = ["COLUMNS", "SCHEMA_VERSION", "TRACE_SCHEMA", "Trace", "TraceError", "conform"]
