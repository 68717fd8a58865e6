"""Loading records: schema validation with errors naming file, column and rows (exit 2)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llm_replay.reports import RECORD_SCHEMA, ReportError, load_records, load_run
from llm_replay.reports.records import ANALYSIS_COLUMNS
from tests.conftest import run_cli
from tests.reports.conftest import records
from tests.reports.test_metrics import HAND


def test_minimal_columns_are_completed_with_nulls(tmp_path):
    pq.write_table(pa.table({"request_id": ["a", "b"], "status": ["ok", "timeout"],
                             "sent_s": [0.0, 1.0], "token_times": [[0.1, 0.2], None]}), tmp_path / "r.parquet")
    t = load_records(tmp_path / "r.parquet")
    assert t.schema.names == RECORD_SCHEMA.names and t.num_rows == 2
    assert t.column("token_times").type == pa.list_(pa.float32())   # float64 lists are cast


@pytest.mark.parametrize("table, words", [
    (pa.table({"request_id": ["a"]}), "missing required column(s) status"),
    (pa.table({"request_id": ["a", "b"], "status": ["ok", "exploded"]}), "field 'status': unknown status"),
    (pa.table({"request_id": ["a", None], "status": ["ok", "ok"]}), "field 'request_id': must not be null: rows 1"),
    (pa.table({"request_id": ["a"], "status": ["ok"], "sent_s": ["soon"]}), "field 'sent_s': has type string"),
])
def test_invalid_records_name_the_problem(tmp_path, table, words):
    pq.write_table(table, tmp_path / "records.parquet")
    with pytest.raises(ReportError) as e:
        load_records(tmp_path)
    assert words in str(e.value) and "records.parquet" in str(e.value) and e.value.exit_code == 2


def test_cli_reports_bad_input_without_traceback(tmp_path):
    (tmp_path / "records.parquet").write_text("not parquet")
    r = run_cli("replay", "report", tmp_path)
    assert r.returncode == 2 and "cannot read records" in r.stderr and "Traceback" not in r.stderr


def test_truncated_arrow_stream_from_a_killed_run_keeps_complete_batches(tmp_path):
    t = records(HAND)
    path = tmp_path / "records.arrows"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t.slice(0, 2))
        w.write_table(t.slice(2))
    data = path.read_bytes()
    path.write_bytes(data[:-60])                       # cut into the last batch
    assert load_records(tmp_path).num_rows == 2


def test_analysis_columns_leave_request_id_unread_only_where_statistics_prove_it_non_null(tmp_path):
    t = records(HAND)
    pq.write_table(t, tmp_path / "records.parquet")
    run = load_run(tmp_path, columns=ANALYSIS_COLUMNS)
    assert "request_id" not in run.records.column_names and "token_times" in run.records.column_names
    assert run.column("request_id").to_pylist() == ["a", "b", "c"]
    pq.write_table(t, tmp_path / "records.parquet", write_statistics=False)   # cannot tell: read it
    assert "request_id" in load_run(tmp_path, columns=ANALYSIS_COLUMNS).records.column_names
    bad = pa.table({"request_id": ["a", None], "status": ["ok", "ok"]})
    for stats in (True, False):
        pq.write_table(bad, tmp_path / "records.parquet", write_statistics=stats)
        with pytest.raises(ReportError, match="field 'request_id': must not be null: rows 1"):
            load_run(tmp_path, columns=ANALYSIS_COLUMNS)
    pq.write_table(pa.table({"status": ["ok"]}), tmp_path / "records.parquet")
    with pytest.raises(ReportError, match="missing required column"):
        load_run(tmp_path, columns=ANALYSIS_COLUMNS)
