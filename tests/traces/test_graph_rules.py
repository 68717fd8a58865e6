"""Task graph columns (task_id, depends_on, delay_s): every rule is a one-line error naming the
file, column and rows, in Trace, validate_file and replay run; CSV round-trips the lists."""
from __future__ import annotations

import pyarrow as pa
import pytest

from tests.conftest import run_cli
from llm_replay.traces.errors import TraceError
from llm_replay.traces.trace import Trace
from llm_replay.traces.validate import validate_file


def table(deps, tasks=None, delay=None, ids=None):
    n = len(deps)
    cols = {"arrival_ns": list(range(n)), "input_tokens": [10] * n, "output_tokens": [5] * n,
            "request_id": ids or [f"r{i}" for i in range(n)], "task_id": tasks or ["t"] * n,
            "depends_on": pa.array(deps, pa.list_(pa.string()))}
    if delay is not None:
        cols["delay_s"] = pa.array(delay, pa.float64())
    return pa.table(cols)


BAD = [
    (table([None, ["r9"]]), "depends_on", "unknown request_id 'r9': rows 1"),
    (table([None, ["r1"]]), "depends_on", "a row depends on itself: rows 1"),
    (table([["r1"], ["r0"]]), "depends_on", "forms a cycle: r0 -> r1 -> r0"),
    (table([None, ["r2"], None]), "depends_on", "comes later in the trace"),
    (table([None, ["r0"]], tasks=["a", "b"]), "depends_on", "a row of another task ('a', not 'b')"),
    (table([None, ["r0"]], tasks=["a", None]), "task_id", "needs a task_id"),
    (table([None, ["r0"]], delay=[1.0, None]), "delay_s", "without depends_on"),
    (table([None, ["r0"]], delay=[None, -1.0]), "delay_s", "finite number of seconds >= 0"),
    (table([None, ["r0"]], delay=[None, float("inf")]), "delay_s", "finite number of seconds >= 0"),
]


@pytest.mark.parametrize("t, column, rule", BAD)
def test_rules_in_memory_and_on_disk(tmp_path, t, column, rule):
    with pytest.raises(TraceError, match=rule.replace("(", r"\(").replace(")", r"\)")) as e:
        Trace(t, file="t.parquet")
    assert e.value.column == column and "\n" not in str(e.value)
    path = tmp_path / "t.parquet"
    import pyarrow.parquet as pq
    pq.write_table(t, path)
    with pytest.raises(TraceError, match=column):
        validate_file(path)
    p = run_cli("replay", "run", "--trace", path, "--target", "http://127.0.0.1:9", "--no-check", "-o", tmp_path / "r")
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    assert column in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_valid_graph_and_csv_round_trip(tmp_path):
    t = Trace(table([None, ["r0"], ["r0", "r1"]], delay=[None, 0.5, 1.0]))
    assert t.table.column("depends_on").to_pylist() == [None, ["r0"], ["r0", "r1"]]
    t.write(tmp_path / "g.csv")
    back = Trace.read(tmp_path / "g.csv")
    assert back.table.column("depends_on").to_pylist() == [None, ["r0"], ["r0", "r1"]]
    assert back.table.column("delay_s").to_pylist() == [None, 0.5, 1.0]
    # hand-written CSV: ids separated by ; or spaces
    (tmp_path / "h.csv").write_text("arrival_ns,input_tokens,output_tokens,request_id,task_id,depends_on\n"
                                    "0,1,1,a,t,\n1,1,1,b,t,a\n2,1,1,c,t,a;b\n")
    assert Trace.read(tmp_path / "h.csv").table.column("depends_on").to_pylist() == [None, ["a"], ["a", "b"]]
    (tmp_path / "x.csv").write_text("arrival_ns,input_tokens,output_tokens,request_id,task_id,depends_on\n"
                                    '0,1,1,a,t,\n1,1,1,b,t,"[""a"""\n')
    with pytest.raises(TraceError, match=r"depends_on is not a JSON list.*rows 1"):
        Trace.read(tmp_path / "x.csv")
