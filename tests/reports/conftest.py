"""Fixtures for reports tests: hand-made records tables and synthetic run directories."""
from __future__ import annotations

import pyarrow as pa
import pytest

from llm_replay.reports.schema import RECORD_SCHEMA
from tests.reports.synth import synth_records, write_run


def records(rows: list[dict]) -> pa.Table:
    """A records table from partial row dicts (absent fields are null)."""
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)


@pytest.fixture
def make_run(tmp_path):
    """make_run(name, table=None, **synth_kw) -> a run directory with records.parquet."""
    def make(name: str, table: pa.Table | None = None, config: dict | None = None, server=None, **kw):
        table = table if table is not None else synth_records(kw.pop("n", 2000), **kw)
        return write_run(tmp_path / name, table, config, server)
    return make
