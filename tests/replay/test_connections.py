"""Connection set-up in `replay run` (real runner processes against the SSE test server, which logs
every connection it accepts): `connect_s` exactly where a request opened a connection, and
`--preconnect N` opening them before T0 (one process, and split across two workers)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.replay.runkit import records, replay_run, sse_server, write_trace


def _accepted(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


METRICS_READ = 1   # the parent's one GET /metrics before the probes (run.json cache_state): not the runner's


@pytest.mark.timing
def test_connect_s_where_a_connection_was_opened(tmp_path):
    # 6 requests at once (6 new connections), then 10 at once: 6 reuse those, 4 open new ones
    arrival = np.array([0] * 6 + [300_000_000] * 10, dtype="int64")
    trace = write_trace(tmp_path / "t.parquet", 16, arrival_ns=arrival)
    log = tmp_path / "conns.log"
    with sse_server("--interval", "0.005", "--conn-log", str(log)) as url:
        replay_run(trace, url, tmp_path / "run", "--model-map", "*=sse-test")   # no model probe
        accepted = _accepted(log)
    df = records(tmp_path / "run")
    assert (df.status == "ok").all() and len(df) == 16
    new = df.connect_s.notna()
    assert new.sum() == accepted - METRICS_READ == 10   # one connect_s per connection the runner opened
    assert (df.connect_s[new] > 0).all() and (df.connect_s[new] < 1).all()
    assert new[df.scheduled_s == 0].all()               # nothing to reuse at the start
    assert (~new[df.scheduled_s > 0]).sum() == 6        # the 6 kept-alive connections were reused
    cn = json.loads((tmp_path / "run" / "summary.json").read_text())["connections"]
    assert cn["recorded"] and (cn["opened"], cn["reused"]) == (10, 6) and cn["connect_ms"]["n"] == 10


@pytest.mark.timing
@pytest.mark.parametrize("workers", [1, 2])
def test_preconnect_opens_the_connections_before_t0(tmp_path, workers):
    trace = write_trace(tmp_path / "t.parquet", 8, gap_s=0.0)     # 8 requests at once
    log = tmp_path / "conns.log"
    with sse_server("--interval", "0.005", "--conn-log", str(log)) as url:
        proc = replay_run(trace, url, tmp_path / "run", "--model-map", "*=sse-test", "--preconnect", "8",
                          "--workers", str(workers))
        accepted = _accepted(log)
    df = records(tmp_path / "run")
    assert (df.status == "ok").all() and len(df) == 8
    assert df.connect_s.isna().all()                    # every request reused a preconnected connection
    assert accepted - METRICS_READ == 8
    said = [line for line in proc.stderr.splitlines() if "preconnect" in line]
    if workers == 1:
        assert said and said[0].startswith("replay: preconnect: opened 8 connections in ")
    else:                                               # 4 each
        assert sorted(line.split(" in ")[0] for line in said) == [
            "replay: worker 0: preconnect: opened 4 connections", "replay: worker 1: preconnect: opened 4 connections"]
    assert set(df.worker) == set(range(workers))
    cn = json.loads((tmp_path / "run" / "summary.json").read_text())["connections"]
    assert cn["recorded"] and (cn["opened"], cn["reused"]) == (0, 8) and cn["warning"] is None
