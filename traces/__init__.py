"""The trace: schema, read/write, validate, import, generate, fit, transform, describe.

Depends only on pyarrow/numpy (and scipy/pandas for statistics); never on replay or reports.
Names load lazily, so `replay --help` and argument errors (the parser imports traces.cli)
never load pyarrow.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"TraceError": "errors", "COLUMNS": "schema", "SCHEMA_VERSION": "schema", "TRACE_SCHEMA": "schema",
            "Trace": "trace", "conform": "trace"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'traces' has no attribute {name!r}")
