"""replay.recorder: record batches (token offsets built per batch) and the flush policy."""
from __future__ import annotations

from array import array
from types import SimpleNamespace

import pyarrow as pa

from llm_replay.replay import plan
from llm_replay.replay.recorder import RECORD_SCHEMA, Recorder, record, to_batch, unsent


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
