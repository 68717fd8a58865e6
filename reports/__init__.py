"""The verdict: records schema, metrics, goodput, SLO spec and gate, compare, HTML/MD/JSON.

Works on a records file alone (never imports locust, replay or engine_stub), so it can
analyse runs made elsewhere. Names load lazily, so `import reports` (done by the `replay`
command to build its parser) stays cheap.
"""
from __future__ import annotations

import importlib

_EXPORTS = {name: module for module, names in (     # each module, then the names it exports
    ("schema", "RECORD_SCHEMA RECORDS_SCHEMA_VERSION SERVER_METRICS_SCHEMA STATUSES"),
    ("errors", "ReportError SloSpecError"), ("records", "load_records load_run conform_records"),
    ("analysis", "analyze Analysis"), ("summary", "summarize_run SUMMARY_SCHEMA_VERSION"),
    ("text", "format_summary headline"), ("slo", "load_slo SloSpec"), ("gate", "evaluate_slo GateResult"),
    ("compare", "compare_runs CompareResult"), ("importers", "import_results")) for name in names.split()}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'reports' has no attribute {name!r}")
