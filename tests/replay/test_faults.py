"""Every fault kind still yields exactly one record per trace row, with the right status."""
from __future__ import annotations

import time

import pytest

from tests.conftest import free_port
from tests.replay.runkit import (assert_well_formed, popen_run, records, replay_run, sse_server,
                                 start_sse, stop, wait_t0, write_trace)

# fault mode of the test server -> (status, http_status) of the faulty requests
FAULTS = {
    "http500": ("http_error", 500),
    "http429": ("http_error", 429),
    "stall": ("timeout", 200),
    "drop": (("connection_error", "protocol_error"), 200),
    "malformed": ("protocol_error", 200),
    "error_in_stream": ("http_error", 200),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_kinds(tmp_path, fault):
    n = 60
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.005, output_tokens=8)
    with sse_server("--interval", "0.002", "--fault", fault, "--fault-every", "3") as url:
        replay_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--timeout", "0.6")
    df = records(tmp_path / "run")
    assert len(df) == n and df.request_id.is_unique
    assert_well_formed(df)
    status, http = FAULTS[fault]
    bad = df[df.status != "ok"]
    assert len(bad) == n // 3, df.status.value_counts()
    assert bad.status.isin([status] if isinstance(status, str) else status).all(), bad.status.value_counts()
    assert (bad.http_status == http).all() and bad.error.notna().all()
    assert (df[df.status == "ok"].completion_tokens == 8).all()


def test_connection_refused(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 20)
    replay_run(trace, f"http://127.0.0.1:{free_port()}", tmp_path / "run", "--model-map", "*=m")
    df = records(tmp_path / "run")
    assert len(df) == 20 and (df.status == "connection_error").all()
    assert df.error.notna().all() and df.sent_s.isna().all() is not None


def test_target_killed_and_restarted_mid_run(tmp_path):
    n = 150  # 3 s of trace at 50 req/s; the server is down from ~0.8 s to ~1.6 s
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.02, output_tokens=4)
    port = free_port()
    srv = start_sse("--interval", "0.002", port=port)
    url = srv.url
    run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--timeout", "2")
    try:
        t0 = wait_t0(tmp_path / "run")
        time.sleep(max(0.0, t0 + 0.8 - time.time()))
        stop(srv)
        time.sleep(0.8)
        srv = start_sse("--interval", "0.002", port=port)
        out, err = run.communicate(timeout=60)
    finally:
        stop(srv)
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    df = records(tmp_path / "run").sort_values("scheduled_s")
    assert len(df) == n
    assert_well_formed(df)
    failed = df[df.status != "ok"]
    assert len(failed) > 0 and failed.status.isin(["connection_error", "protocol_error"]).all()
    last_failure = failed.scheduled_s.max()
    after = df[df.scheduled_s > last_failure]
    assert len(after) > 10 and (after.status == "ok").all(), "requests succeed again after the restart"
    assert (df[df.scheduled_s < failed.scheduled_s.min()].status == "ok").all()
