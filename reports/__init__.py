"""The verdict: records schema, metrics, goodput, SLO spec and gate, compare, HTML/MD/JSON.

Works on a records file alone (never imports locust, replay or engine_stub), so it can
analyse runs made elsewhere.
"""
from .schema import RECORD_SCHEMA, RECORDS_SCHEMA_VERSION, SERVER_METRICS_SCHEMA, STATUSES

__all__ = ["RECORD_SCHEMA", "RECORDS_SCHEMA_VERSION", "SERVER_METRICS_SCHEMA", "STATUSES"]
