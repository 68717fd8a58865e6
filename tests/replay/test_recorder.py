"""replay.recorder: record batches (token offsets built per batch) and the flush policy."""
from __future__ import annotations

from array import array
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from llm_replay.replay import plan
from llm_replay.replay.recorder import RECORD_LAYOUT, RECORD_SCHEMA, Recorder, record, to_batch, unsent, unsent_batch
from llm_replay.traces.trace import Trace


def _row(i: int) -> tuple:
    row = [None] * plan.ROW_LEN
    row[plan.RID], row[plan.SCHED], row[plan.IN], row[plan.OUT] = str(i), i * 0.01, 8, 3
    return tuple(row)


def _result(i: int, n: int, chunks=None, reasoning: int = 0, connect_s: float | None = None):
    """n token chunks 0.1 s apart, the first `reasoning` of them reasoning; `connect_s`: the
    request opened its connection in that long (None: it reused a kept-alive one)."""
    sent = 100.0 + i
    tt = array("d", [sent + 0.1 * (k + 1) for k in range(n)])
    return SimpleNamespace(sent=sent, connect_s=connect_s, first_token=tt[0] if n else None, last_token=tt[-1] if n else None,
                           first_answer=tt[reasoning] if reasoning < n else None, token_times=tt,
                           chunk_tokens=chunks, prompt_tokens=8, completion_tokens=n,
                           reasoning_tokens=reasoning or None, reasoning_chunks=min(reasoning, n),
                           status="ok" if n else "http_error", http_status=200 if n else 500,
                           error=None if n else "HTTP 500", end=tt[-1] if n else sent, cached_tokens=None)


def test_batch_matches_row_by_row_conversion():
    recs = [record(_row(i), "m", 0, 100.0, _result(i, i % 5, [1, 40000, 2, 3][:i % 5] if i % 3 else None))
            for i in range(40)] + [unsent(_row(99), "m", 0)]
    got = to_batch(recs)
    want = []
    for i in range(40):
        n = i % 5
        want.append([0.1 * (k + 1) for k in range(n)])
    want.append(None)
    assert got.schema == RECORD_SCHEMA and got.num_rows == 41
    assert got.column("token_times").to_pylist() == pa.array(want, RECORD_SCHEMA.field("token_times").type).to_pylist()
    ct = got.column("chunk_tokens").to_pylist()
    assert ct[1] == [1] and ct[4] == [1, 32767, 2, 3] and ct[3] is None and ct[40] is None   # clamped to int16
    assert got.column("sent_s").to_pylist()[:2] == [0.0, 1.0] and to_batch([]).num_rows == 0
    assert got.column("first_answer_s").to_pylist()[:2] == [None, got.column("first_token_s")[1].as_py()]
    assert got.column("reasoning_chunks").null_count == 41    # no reasoning phase: null (= 0)


def test_reasoning_columns():
    recs = [record(_row(0), "m", 0, 100.0, _result(0, 5, reasoning=3)),     # 3 reasoning, 2 answer
            record(_row(1), "m", 0, 100.0, _result(1, 4, reasoning=4))]     # reasoning only: no answer
    got = to_batch(recs).to_pydict()
    assert got["reasoning_tokens"] == [3, 4] and got["reasoning_chunks"] == [3, 4]
    assert abs(got["first_answer_s"][0] - 0.4) < 1e-9 and got["first_answer_s"][1] is None
    assert abs(got["first_token_s"][0] - 0.1) < 1e-9


def test_connect_s_column():
    """connect_s (float32 s) where the request opened its connection, null where it reused one
    or was never sent; every record tuple has the schema's arity."""
    recs = [record(_row(0), "m", 0, 100.0, _result(0, 3, connect_s=0.0125)),
            record(_row(1), "m", 0, 100.0, _result(1, 3)), unsent(_row(2), "m", 0)]
    assert all(len(r) == len(RECORD_SCHEMA) for r in recs)
    got = to_batch(recs)
    assert got.schema.field("connect_s").type == pa.float32()
    c = got.column("connect_s").to_pylist()
    assert abs(c[0] - 0.0125) < 1e-6 and c[1] is None and c[2] is None
    assert got.column("sent_s").to_pylist()[:2] == [0.0, 1.0]


def test_records_follow_the_layout():
    """The layout decides: a not-sent record takes each field the layout sends to a row column from
    the row's field of that name and is null elsewhere (but whom it was for, status and error); the
    row constants name the row fields they index."""
    assert [plan.ROW_FIELDS[i] for i in (plan.RID, plan.SCHED, plan.IN, plan.OUT, plan.MODEL, plan.SESSION,
            plan.SLO, plan.IMAGES, plan.TASK, plan.DEPS, plan.DELAY, plan.REASON, plan.NDEP, plan.CONV)] == [
        "request_id", "scheduled_s", "input_tokens", "output_tokens", "model", "session_id", "slo_class",
        "num_images", "task_id", "depends_on", "delay_s", "reasoning_tokens", "ndep", "conv"]
    row = tuple(f"v{i}" for i in range(plan.ROW_LEN))
    rec = unsent(row, "tm", 7, "cancelled", "why", "http://t")
    by_caller = {"target_model": "tm", "worker": 7, "status": "cancelled", "error": "why", "target": "http://t"}
    assert rec._fields == tuple(RECORD_SCHEMA.names) == record(_row(0), "m", 0, 100.0, _result(0, 2))._fields
    for f, col in RECORD_LAYOUT:
        assert getattr(rec, f.name) == (row[plan.ROW_FIELDS.index(col)] if col else by_caller.get(f.name))


def test_flush_policy_oldest_first_and_every_record_within_two_periods():
    out: list[str] = []
    rec = Recorder(lambda b: out.extend(b.column("request_id").to_pylist()))
    for i in range(10):
        rec.add(unsent(_row(i), "m", 0))
    rec.flush(3)                       # a quiet moment: the oldest three
    assert out == ["0", "1", "2"]
    rec.flush_stale()                  # first period: nothing had waited a whole period yet
    assert out == ["0", "1", "2"]
    for i in range(10, 15):
        rec.add(unsent(_row(i), "m", 0))
    pauses = []
    rec.flush_stale(max_rows=2, pause=lambda: pauses.append(1))   # 3..9 waited a period
    assert out == [str(i) for i in range(10)] and len(pauses) == 3
    rec.flush_stale()
    assert out == [str(i) for i in range(15)] and not rec.buf and rec.flushed == rec.count == 15


def test_a_second_thread_flushes_while_records_are_added():
    """The runner's watch thread flushes while the hub adds: every record reaches the sink once, in order."""
    import threading
    out: list[str] = []
    rec = Recorder(lambda b: out.extend(b.column("request_id").to_pylist()), threading.RLock())
    done = threading.Event()

    def watch():
        while not done.is_set():
            rec.flush_to(rec.count, max_rows=7)
    t = threading.Thread(target=watch)
    t.start()
    rows = [unsent(_row(i), "m", 0) for i in range(20_000)]
    for i, r in enumerate(rows):
        rec.add(r)
        if i % 1000 == 0:
            rec.flush_stale(max_rows=50)
    done.set()
    t.join()
    rec.flush()
    assert out == [str(i) for i in range(20_000)] and rec.flushed == rec.count and not rec.buf


def _window(tmp_path, ids: bool, **kw) -> plan.TraceWindow:
    n = 700
    cols = {"arrival_ns": pa.array(np.arange(n) * 10**7), "input_tokens": pa.array(np.full(n, 9), pa.int32()),
            "output_tokens": pa.array(np.arange(n) % 7 + 1, pa.int32()),
            "model": pa.array([["a", "b", None, "c"][i % 4] for i in range(n)]),
            "slo_class": pa.array([None if i % 3 else "gold" for i in range(n)]),
            "num_images": pa.array([i % 2 for i in range(n)], pa.int16()),
            "reasoning_tokens": pa.array([None if i % 5 else 1 for i in range(n)], pa.int32()),
            "task_id": pa.array([f"T{i // 10}" for i in range(n)]),
            "depends_on": pa.array([[f"{'r' if ids else ''}{i - 1}"] if i % 10 else None for i in range(n)],
                                   pa.list_(pa.string())),
            "delay_s": pa.array([0.5 if i % 10 else None for i in range(n)], pa.float32())}
    if ids:
        cols["request_id"] = pa.array([f"r{i}" for i in range(n)])
    Trace(pa.table(cols)).write(tmp_path / "t.parquet")
    config = plan.RunConfig(trace=str(tmp_path / "t.parquet"), target="http://d", run_dir=str(tmp_path),
                            model_map={"a": "A"}, targets={"b": "http://b"}, default_model="D",
                            served_defaults={"http://b": "B"}, speed=2.0, start_s=1.0, **kw)
    return plan.TraceWindow(config, batch_size=64)


@pytest.mark.parametrize("ids", [True, False])
def test_bulk_unsent_records_equal_row_by_row(tmp_path, ids):
    """`unsent_batch` of `TraceWindow.rest` (after a few chunks of `rows`, as a stopping
    dispatcher reads them) writes, column for column, the records `unsent` writes row by row."""
    c = _window(tmp_path, ids, max_requests=500).config
    want = to_batch([unsent(r, c.target_model(r[plan.MODEL]), 3, "not_sent", "why", c.target_of(r[plan.MODEL]))
                     for chunk in _window(tmp_path, ids, max_requests=500).rows() for r in chunk])
    w = _window(tmp_path, ids, max_requests=500).prefetch()
    rows = w.rows()
    head = [r for _ in range(2) for r in next(rows)]
    got = [unsent_batch(t, c, 3, "not_sent", "why") for t in w.rest(min_rows=100)]
    assert next(rows, None) is None and [t.num_rows for t in got][:3] == [128, 128, 128]
    assert 64 < len(head) < 128 and len(head) + sum(b.num_rows for b in got) == want.num_rows == 500
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches([want.slice(len(head))]))
