"""Ctrl-C finalises a run (in flight -> cancelled, unsent -> not_sent); a killed runner keeps
every record that finished more than a second before the kill."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import pyarrow as pa

from llm_replay.replay.recorder import read_stream
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


def _run_and_kill(tmp_path, kill_runner_only: bool) -> tuple[object, set[str]]:
    """Start a run, SIGKILL the runner (or `replay run` itself) 2.5 s after T0; return the
    finished `replay run` process and the rows that surely ended more than 1 s before the kill."""
    trace = write_trace(tmp_path / "t.parquet", N, gap_s=GAP, output_tokens=4)
    with sse_server("--interval", "0.001") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m")
        t0 = wait_t0(tmp_path / "run")
        child = psutil.Process(run.pid).children()[0]
        time.sleep(max(0.0, t0 + 2.5 - time.time()))
        kill_wall = time.time()
        os.kill(child.pid if kill_runner_only else run.pid, signal.SIGKILL)
        run.out, run.err = run.communicate(timeout=60)
        child.wait(10)  # PR_SET_PDEATHSIG: the runner never outlives `replay run`
    cutoff = kill_wall - t0 - 1.0 - 0.2
    return run, {str(i) for i in range(N) if i * GAP < cutoff}


def test_sigkill_of_runner_keeps_flushed_records(tmp_path):
    run, expected = _run_and_kill(tmp_path, kill_runner_only=True)
    assert run.returncode == 1 and "records flushed before that were kept" in run.err
    df = records(tmp_path / "run")  # finalised by `replay run` after its runner died
    assert len(df) == N and df.request_id.is_unique  # still one record per row
    ok = df[df.status == "ok"]
    assert len(expected) > 50 and expected <= set(ok.request_id)
    lost = df[df.status != "ok"]
    assert len(lost) > 0 and (lost.error == "runner died").all()
    assert lost.status.isin(["cancelled", "not_sent"]).all()
    assert lost[lost.status == "not_sent"].scheduled_s.min() > ok.scheduled_s.max() - 1.5
    info = run_info(tmp_path / "run")
    assert info["status"] == "failed" and sum(info["status_counts"].values()) == N
    assert f"status: failed  " in run.out and f"ok {len(ok)}" in run.out    # the last line has the counts


def test_sigkill_of_replay_run_takes_the_runner_along_and_keeps_the_stream(tmp_path):
    run, expected = _run_and_kill(tmp_path, kill_runner_only=False)
    table = pa.Table.from_batches(list(read_stream(tmp_path / "run" / "records.arrows")))
    assert len(expected) > 50 and expected <= set(table.column("request_id").to_pylist())


def test_the_last_progress_line_after_ctrl_c_counts_only_what_ended():
    """Issue 22 item 6: after Ctrl-C the final line said `done 191` when 2 requests were done."""
    from llm_replay.replay.progress import Progress
    p = Progress(191, 10.0)
    status = ["ok", "ok", "cancelled"] + ["not_sent"] * 188
    p.add(pa.record_batch({"status": pa.array(status), "completion_tokens": pa.array([4] * 191, pa.int32()),
                           "sent_s": pa.array([0.0] * 191), "scheduled_s": pa.array([0.0] * 191)}))
    line = p.line()
    assert "done 2 " in line and "cancelled 1" in line and "not sent 188" in line, line
