"""Trace type: Parquet round trip keeps values and metadata; validation names file, column, rows, rule."""
import pyarrow as pa
import pytest

from llm_replay.traces import Trace, TraceError


def _table(**over):
    cols = {"arrival_ns": [0, 1_000, 2_000], "input_tokens": [10, 20, 30], "output_tokens": [5, None, 7]}
    cols.update(over)
    return pa.table(cols)


def test_parquet_round_trip(tmp_path):
    t = Trace(_table(model=["a", "b", "a"]), {"source": {"format": "test"}})
    p = tmp_path / "t.parquet"
    t.write(p)
    back = Trace.read(p)
    assert back.table.column("arrival_ns").to_pylist() == [0, 1_000, 2_000]
    assert back.table.column("output_tokens").to_pylist() == [5, None, 7]
    assert back.table.column("request_id").to_pylist() == ["0", "1", "2"]
    assert back.table.column("model").to_pylist() == ["a", "b", "a"]
    assert back.metadata["source"] == {"format": "test"}
    assert back.table.schema.field("arrival_ns").type == pa.int64()
    batches = list(Trace.iter_batches(p, batch_size=2))
    assert [b.num_rows for b in batches] == [2, 1]


def test_exact_int64_arrivals(tmp_path):
    big = 2**62 + 1  # not representable in float64
    t = Trace(pa.table({"arrival_ns": pa.array([big, big + 1], pa.int64()),
                        "input_tokens": [1, 1], "output_tokens": [1, 1]}))
    t.write(tmp_path / "t.parquet")
    assert Trace.read(tmp_path / "t.parquet").table.column("arrival_ns").to_pylist() == [big, big + 1]


@pytest.mark.parametrize("table, needle", [
    (pa.table({"arrival_ns": [0]}), "missing required column(s) input_tokens, output_tokens"),
    (_table(arrival_ns=[0, -5, -6]), "arrival_ns must be >= 0: rows 1, 2 (of 3 rows)"),
    (_table(input_tokens=[1.0, float("nan"), 3.0]), "column 'input_tokens': must not be NaN: rows 1"),
    (_table(input_tokens=[1, 2**40, 3]), "overflows int32: rows 1"),
    (_table(arrival_ns=[5, 1, 9]), "non-decreasing (use --sort"),
    (_table(request_id=["x", "y", "x"]), "request_id must be unique"),
    (_table(input_tokens=["a", "b", "c"]), "column 'input_tokens'"),
])
def test_validation_messages(table, needle):
    with pytest.raises(TraceError) as e:
        Trace(table, file="t.parquet")
    assert needle in str(e.value)
    assert str(e.value).startswith("t.parquet")


def test_sort_fixes_order():
    t = Trace(_table(arrival_ns=[5, 1, 9]), sort=True)
    assert t.table.column("arrival_ns").to_pylist() == [1, 5, 9]
    assert t.table.column("request_id").to_pylist() == ["1", "0", "2"]


def test_empty_and_unreadable(tmp_path):
    with pytest.raises(TraceError, match="empty"):
        Trace(pa.table({"arrival_ns": pa.array([], pa.int64()), "input_tokens": pa.array([], pa.int32()),
                        "output_tokens": pa.array([], pa.int32())}))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        Trace.read(bad)
    with pytest.raises(TraceError, match="file not found"):
        Trace.read(tmp_path / "missing.parquet")
