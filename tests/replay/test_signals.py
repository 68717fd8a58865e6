"""Ctrl-C finalises a run (in flight -> cancelled, unsent -> not_sent); a killed runner keeps
every record that ended more than RECORD_DELAY_S before the kill, whatever its event loop is doing."""
from __future__ import annotations

import json
import math
import os
import signal
import time

import numpy as np
import psutil
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from llm_replay.replay.output import RECORD_DELAY_S
from llm_replay.replay.recorder import read_stream
from llm_replay.traces.trace import Trace
from tests.replay.runkit import (assert_well_formed, popen_run, records, run_info, sse_server,
                                 wait_t0, write_trace)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigint_cancels_in_flight_and_records_unsent(tmp_path, workers):
    n = 100  # 10 s of trace; every request streams for ~2 s, so some are in flight at the signal
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.1, output_tokens=20)
    with sse_server("--interval", "0.1") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--grace", "0.3", "--workers", workers)
        t0 = wait_t0(tmp_path / "run")
        time.sleep(max(0.0, t0 + 3.0 - time.time()))
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    df = records(tmp_path / "run")
    assert len(df) == n and df.request_id.is_unique
    assert_well_formed(df)
    counts = df.status.value_counts().to_dict()
    assert counts.get("ok", 0) >= 5 and counts.get("cancelled", 0) >= 5 and counts.get("not_sent", 0) >= 50, counts
    cancelled = df[df.status == "cancelled"]
    assert cancelled.sent_s.notna().all()
    assert df[df.status == "not_sent"].scheduled_s.min() > df[df.status == "ok"].scheduled_s.max()
    info = run_info(tmp_path / "run")
    assert info["status"] == "interrupted" and sum(info["status_counts"].values()) == n
    assert not (tmp_path / "run" / "records.arrows").exists()
    assert "interrupted" in out


N, GAP = 400, 0.01  # 4 s of trace of ~10 ms requests; the kill comes 2.5 s after T0


def _ids(path) -> set[str] | None:
    """The request ids in an IPC stream; None once it is gone (finalised into records.parquet)."""
    ids = {r for b in read_stream(path) for r in b.column("request_id").to_pylist()}
    return ids if path.exists() else None


def _watch_stream(run, run_dir, until=lambda: False) -> list[tuple[float, set[str]]]:
    """(wall time, request ids in records.arrows then) about every 20 ms while `run` runs: what a
    kill -9 at that time would have left on disk (the time is taken before the file is read)."""
    snaps, deadline = [], time.monotonic() + 300
    while run.poll() is None and not until() and time.monotonic() < deadline:
        w, ids = time.time(), _ids(run_dir / "records.arrows")
        if ids is not None:
            snaps.append((w, ids))
        time.sleep(0.02)
    return snaps


def _late(snaps, ends: dict[str, float]) -> list[tuple[str, float]]:
    """(request id, seconds since its end) for each snapshot that lacked a request which had ended
    (its own end_s, on the wall clock) more than RECORD_DELAY_S before the snapshot: the promise."""
    return sorted(((r, round(w - e, 2)) for w, ids in snaps for r, e in ends.items()
                   if e < w - RECORD_DELAY_S and r not in ids), key=lambda x: -x[1])   # the worst first


def _ends(table, t0_wall: float) -> dict[str, float]:
    d = table.select(["request_id", "end_s"]).to_pydict()
    return {r: t0_wall + e for r, e in zip(d["request_id"], d["end_s"]) if e is not None}


def _run_and_kill(tmp_path, kill_runner_only: bool):
    """Start a run, watch records.arrows, SIGKILL the runner (or `replay run` itself) 2.5 s after
    T0; return the finished `replay run` process, the snapshots before the kill and T0."""
    trace = write_trace(tmp_path / "t.parquet", N, gap_s=GAP, output_tokens=4)
    with sse_server("--interval", "0.001") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m")
        t0 = wait_t0(tmp_path / "run")
        child = psutil.Process(run.pid).children()[0]
        snaps = _watch_stream(run, tmp_path / "run", until=lambda: time.time() > t0 + 2.5)
        os.kill(child.pid if kill_runner_only else run.pid, signal.SIGKILL)
        run.out, run.err = run.communicate(timeout=60)
        child.wait(10)  # PR_SET_PDEATHSIG: the runner never outlives `replay run`
    return run, snaps, t0


def test_sigkill_of_runner_keeps_flushed_records(tmp_path):
    run, snaps, t0 = _run_and_kill(tmp_path, kill_runner_only=True)
    assert run.returncode == 1 and "records flushed before that were kept" in run.err
    df = records(tmp_path / "run")  # finalised by `replay run` after its runner died
    assert len(df) == N and df.request_id.is_unique  # still one record per row
    ok = df[df.status == "ok"]
    assert snaps[-1][1] <= set(ok.request_id) and len(ok) > 50   # nothing on disk before the kill was lost
    assert not _late(snaps, {r: t0 + e for r, e in zip(ok.request_id, ok.end_s)})
    lost = df[df.status != "ok"]
    assert len(lost) > 0 and (lost.error == "runner died").all()
    assert lost.status.isin(["cancelled", "not_sent"]).all()
    assert lost[lost.status == "not_sent"].scheduled_s.min() > ok.scheduled_s.max() - 1.5
    info = run_info(tmp_path / "run")
    assert info["status"] == "failed" and sum(info["status_counts"].values()) == N
    assert f"status: failed  " in run.out and f"ok {len(ok)}" in run.out    # the last line has the counts


@pytest.mark.timing   # the promise is a delay: a runner starved of CPU (load 15 on 2 cores) flushed 1.04 s after an end
def test_sigkill_of_replay_run_takes_the_runner_along_and_keeps_the_stream(tmp_path):
    """Judged by the records' own end times: every one that ended more than RECORD_DELAY_S before
    a snapshot was in it (on a busy host requests end later than scheduled: that is no loss)."""
    run, snaps, t0 = _run_and_kill(tmp_path, kill_runner_only=False)
    table = pa.Table.from_batches(list(read_stream(tmp_path / "run" / "records.arrows")))
    assert table.num_rows > 50 and snaps[-1][1] <= set(table.column("request_id").to_pylist())
    assert not _late(snaps, _ends(table, t0))


def test_records_reach_disk_in_time_while_a_stop_walks_a_long_trace(tmp_path):
    """Ctrl-C while 100k rows are still to come: the runner records each of them not_sent, a long
    computation in its event loop. A request that ended before it must still reach records.arrows
    within RECORD_DELAY_S (a kill -9 then keeps it). Judged on every record's own end time, from
    the finished run, against snapshots of the stream taken all along."""
    head, tail = 300, 100_000
    at = np.concatenate([np.arange(head) * 0.01, 3600 + np.arange(tail) * 1e-3])
    Trace(pa.table({"arrival_ns": pa.array((at * 1e9).astype("int64")),
                    "input_tokens": pa.array(np.full(head + tail, 20), pa.int32()),
                    "output_tokens": pa.array(np.full(head + tail, 4), pa.int32())})).write(tmp_path / "t.parquet")
    with sse_server("--interval", "0.001") as url:
        run = popen_run(tmp_path / "t.parquet", url, tmp_path / "run", "--model-map", "*=m", "--grace", "0.3")
        t0 = wait_t0(tmp_path / "run")
        snaps = _watch_stream(run, tmp_path / "run", until=lambda: time.time() > t0 + 2.0)
        sig = time.time()
        run.send_signal(signal.SIGINT)
        snaps += _watch_stream(run, tmp_path / "run")
        run.communicate(timeout=300)
    assert run.returncode == 130
    table = pq.read_table(tmp_path / "run" / "records.parquet")
    assert table.num_rows == head + tail
    ends = _ends(table, t0)
    assert len(ends) > 50 and sum(w > sig for w, _ in snaps) > 3    # snapshots during the stop
    assert not _late(snaps, ends)


def test_ctrl_c_on_a_deep_chain_reports_a_row_per_doubling_of_depth(tmp_path):
    """Issue 36: Ctrl-C on a 100k-call chain ended the run, then its report (a row per depth, each
    over every record) ran for minutes. A 3000-call chain stopped after 2 s: every row has its record,
    the summary's depth rows are one per depth to 15 and then one per doubling."""
    n = 3000
    ids = [f"c{i}" for i in range(n)]
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.0, output_tokens=4, request_id=ids, task_id=["T"] * n,
                        depends_on=[None] + [[x] for x in ids[:-1]], delay_s=[None] + [0.01] * (n - 1))
    with sse_server("--interval", "0.001") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--grace", "0.3")
        t0 = wait_t0(tmp_path / "run")
        time.sleep(max(0.0, t0 + 2.0 - time.time()))
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    df = records(tmp_path / "run")
    assert len(df) == n and (df.status == "ok").sum() > 10 and (df.status == "not_sent").sum() > n / 2
    depth = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["by_depth"]
    assert len(depth) == 16 + math.ceil(math.log2(n / 16)) and depth[-1]["to"] == n - 1
    assert sum(d["requests"] for d in depth) == n and "Steps by depth" in out


def test_the_last_progress_line_after_ctrl_c_counts_only_what_ended():
    """Issue 22 item 6: after Ctrl-C the final line said `done 191` when 2 requests were done."""
    from llm_replay.replay.output import Progress
    p = Progress(191, 10.0)
    status = ["ok", "ok", "cancelled"] + ["not_sent"] * 188
    p.add(pa.record_batch({"status": pa.array(status), "completion_tokens": pa.array([4] * 191, pa.int32()),
                           "sent_s": pa.array([0.0] * 191), "scheduled_s": pa.array([0.0] * 191)}))
    line = p.line()
    assert "done 2 " in line and "cancelled 1" in line and "not sent 188" in line, line


@pytest.mark.parametrize("graph,workers", [(False, "1"), (True, "1"), (False, "2"), (True, "2")])
def test_ctrl_c_records_a_long_unsent_remainder_column_wise(tmp_path, graph, workers):
    """Issue 36 item 4: Ctrl-C with 200k rows still to come. Each gets exactly one record,
    `not_sent` (also a dependant whose dependency never ran), written from the trace's record
    batches thousands at a time (run.json `unsent_bulk`), not built row by row; distributed,
    by the master, each with the worker its task would have gone to."""
    head, tail = 200, 200_000
    n = head + tail
    at = np.concatenate([np.arange(head) * 0.01, 3600 + np.arange(tail) * 1e-3])
    cols = {"request_id": [f"r{i}" for i in range(n)]}
    if graph:   # tasks of two calls, the second waiting for the first
        cols.update(task_id=[f"T{i // 2}" for i in range(n)],
                    depends_on=[[f"r{i - 1}"] if i % 2 else None for i in range(n)],
                    delay_s=pa.array([0.01 if i % 2 else None for i in range(n)], pa.float32()))
    trace = write_trace(tmp_path / "t.parquet", n, output_tokens=4, arrival_ns=(at * 1e9).astype("int64"), **cols)
    with sse_server("--interval", "0.001") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--grace", "0.3", "--workers", workers)
        t0 = wait_t0(tmp_path / "run")
        time.sleep(max(0.0, t0 + 3.0 - time.time()))
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=300)
    assert run.returncode == 130, err
    df = records(tmp_path / "run")
    assert len(df) == n and df.request_id.is_unique and set(df.request_id) == set(cols["request_id"])
    assert_well_formed(df)
    rest = df[df.scheduled_s >= 3600]
    assert len(rest) == tail and (rest.status == "not_sent").all() and rest.error.isna().all()
    assert (rest.target_model == "m").all() and rest.sent_s.isna().all()
    assert (df.status == "ok").sum() > head / 2
    if workers == "2" and graph:
        assert set(rest.worker) == {0, 1} and (rest.groupby("task_id").worker.nunique() == 1).all()
    batches, rows = run_info(tmp_path / "run")["unsent_bulk"]
    # row by row only what a process holds as tuples: a chunk being sent, a worker's shipped rows
    assert rows > tail * 0.9 and batches <= rows / 1000, (batches, rows)
