"""`--workers 2`: a Locust master and two local workers give the same record set as one process;
a worker that dies mid-run is reported and its rows are still recorded."""
from __future__ import annotations

import pytest

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import free_port, repo_env, wait_s

from tests.replay.runkit import (run_info, assert_well_formed, popen_run, records, replay_run, sse_server,
                                 wait_t0, write_trace)


@pytest.mark.slow
def test_two_workers_same_record_set_as_local(tmp_path):
    """One local worker plus one joining with `replay worker --master` (as from another host)."""
    n = 300
    sessions = [f"s{i % 7}" if i % 3 == 0 else None for i in range(n)]
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.004, output_tokens=5, session_id=sessions)
    port = free_port()
    with sse_server("--interval", "0.001") as url:
        replay_run(trace, url, tmp_path / "local", "--model-map", "*=m")
        remote = subprocess.Popen([sys.executable, "-m", "llm_replay.replay", "worker", "--master", f"127.0.0.1:{port}"],
                                  env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            replay_run(trace, url, tmp_path / "dist", "--model-map", "*=m", "--workers", "1",
                       "--remote-workers", "1", "--master-bind", f"127.0.0.1:{port}")
            said = remote.communicate(timeout=wait_s(30))[0]
            assert remote.returncode == 0, said  # the remote worker leaves when the master quits
        finally:
            if remote.poll() is None:
                remote.kill()
    # `replay worker` says whom it joined, what it replays, and when it is done
    assert f"replay worker: joined master 127.0.0.1:{port}" in said, said
    assert re.search(r"replay worker: replaying as worker [01] of 2: target http://127\.0\.0\.1:\d+, 300 rows", said), said
    assert re.search(r"replay worker: worker [01] done: \d+ requests sent, 0 failed", said), said
    assert f"replay worker: master 127.0.0.1:{port} ended the run; exiting" in said, said
    assert "Traceback" not in said
    local, dist = records(tmp_path / "local"), records(tmp_path / "dist")
    assert len(dist) == n and set(dist.request_id) == set(local.request_id)
    assert (dist.status == "ok").all() and (local.status == "ok").all()
    assert_well_formed(dist)
    cols = ["request_id", "scheduled_s", "input_tokens", "output_tokens", "completion_tokens", "prompt_tokens"]
    a = local[cols].sort_values("request_id").reset_index(drop=True)
    b = dist[cols].sort_values("request_id").reset_index(drop=True)
    assert a.equals(b)
    assert set(dist.worker) == {0, 1}
    plain = dist[dist.session_id.isna()].sort_values("scheduled_s")
    assert (plain.worker.diff().dropna() != 0).all(), "plain rows alternate round-robin"
    assert (dist[dist.session_id.notna()].groupby("session_id").worker.nunique() == 1).all()
    # the client's CPU over the replay: the master's plus what both workers reported
    cpu = [json.loads((tmp_path / d / "run.json").read_text())["client_cpu_s"] for d in ("local", "dist")]
    assert cpu[0] > 0 and cpu[1] > 0


@pytest.mark.slow
def test_lost_worker_rows_are_recorded(tmp_path):
    n = 400  # 8 s of trace; one worker is killed 1 s in (Locust marks it missing after ~3 s)
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.02, output_tokens=4)
    with sse_server("--interval", "0.002") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--workers", "2")
        t0 = wait_t0(tmp_path / "run", proc=run)
        runner = psutil.Process(run.pid).children()[0]
        time.sleep(max(0.0, t0 + 1.0 - time.time()))
        workers = runner.children()
        assert len(workers) == 2
        os.kill(workers[1].pid, signal.SIGKILL)
        out, err = run.communicate(timeout=wait_s(90))
    assert run.returncode == 1, err                       # a run that lost a worker did not complete
    assert "went missing" in err and "lost during the run" in err
    assert run_info(tmp_path / "run")["status"] == "worker_lost" and "status: worker_lost" in out
    df = records(tmp_path / "run")
    assert len(df) == n and df.request_id.is_unique
    lost = df[df.error.fillna("").str.contains("lost")]
    assert len(lost) > 50 and lost.status.isin(["cancelled", "not_sent"]).all()
    assert lost.worker.nunique() == 1
    assert (df[df.worker != lost.worker.iloc[0]].status == "ok").all(), "the other worker carried on"
