"""The verdict: records schema, metrics, goodput, SLO spec and gate, compare, HTML/MD/JSON.

Works on a records file alone (never imports locust, replay or engine_stub), so it can
analyse runs made elsewhere. Names load lazily, so `import reports` (done by the `replay`
command to build its parser) stays cheap.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "RECORD_SCHEMA": "schema", "RECORDS_SCHEMA_VERSION": "schema", "SERVER_METRICS_SCHEMA": "schema",
    "STATUSES": "schema",
    "ReportError": "errors", "SloSpecError": "errors",
    "load_records": "records", "load_run": "records", "conform_records": "records",
    "analyze": "analysis", "Analysis": "analysis",
    "summarize_run": "summary", "SUMMARY_SCHEMA_VERSION": "summary",
    "format_summary": "text", "headline": "text",
    "load_slo": "slo", "SloSpec": "slo",
    "evaluate_slo": "gate", "GateResult": "gate",
    "compare_runs": "compare", "CompareResult": "compare",
    "import_results": "importers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'reports' has no attribute {name!r}")
