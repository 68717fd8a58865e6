"""replay's locustfile under Locust's own CLI (headless): same records as `replay run`."""
from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import free_port, repo_env, run_cli, wait_s
from tests.replay.runkit import assert_well_formed, records, run_info, sse_server, write_trace

LOCUSTFILE = str(Path(__file__).resolve().parents[2] / "replay" / "locustfile.py")


@pytest.mark.timing
def test_locust_cli_headless_run_and_run_time_limit(tmp_path):
    n = 100  # 100 rows in the first 0.5 s, then 50 rows from 60 s on: --run-time 4s cuts them
    trace = write_trace(tmp_path / "t.parquet", n + 50, gap_s=0.005, output_tokens=5)
    t = pq.read_table(trace)
    late = pa.concat_arrays([t["arrival_ns"].combine_chunks()[:n],
                             pa.array(60_000_000_000 + np.arange(50, dtype=np.int64) * 1_000_000)])
    pq.write_table(t.set_column(0, "arrival_ns", late), trace)
    with sse_server("--interval", "0.001") as url:
        proc = run_cli("locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1", "--host", url,
                       "--trace", trace, "--run-dir", tmp_path / "run", "--no-check", "--no-progress",
                       "--model-map", "*=m", "--run-time", "4s", timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = records(tmp_path / "run")
    assert len(df) == n + 50 and df.request_id.is_unique
    assert_well_formed(df)
    info = run_info(tmp_path / "run")
    assert info["status_counts"] == {"ok": n, "not_sent": 50} and info["status"] == "interrupted"
    final = (proc.stdout + proc.stderr).split("Shutting down")[-1]
    # one Locust request per request (E2E), never one per token; TTFT has a row of its own
    # that stays out of the Aggregated count (else Locust's UI shows twice the request rate)
    assert re.search(rf"E2E\s+all\s+{n}\s", final) and re.search(rf"TTFT\s+all\s+{n}\s", final), final
    assert re.search(rf"Aggregated\s+{n}\s", final), final


SLOW_QUIT = """
import time
from locust import events
from llm_replay.replay.locustfile import *  # noqa: F401,F403  (the same listeners and user class)

@events.test_stop.add_listener
def _slow(environment, **kw):
    time.sleep(1.0)  # a loaded worker: its quit handling outlasts the master's 0.5 s wait
"""


@pytest.mark.parametrize("worker", ["locustfile", "slow-quit"])
def test_locust_cli_distributed_master_and_one_worker(tmp_path, worker):
    """`locust --master` + `locust --worker` processes on the locustfile: the master shards and
    ships the rows, the worker replays them; one record per row, and the master's Locust stats
    (--csv) hold one E2E request and one TTFT entry per row (Aggregated: one per row), even from a worker slow to quit."""
    n = 200
    worker_file = LOCUSTFILE
    if worker == "slow-quit":
        worker_file = tmp_path / "slow_quit.py"
        worker_file.write_text(SLOW_QUIT)
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.005, output_tokens=5)
    port = free_port()
    procs = []
    try:
        with sse_server("--interval", "0.001") as url:
            procs.append(_locust(tmp_path / "master.log", "--headless", "--master", "--expect-workers", "1",
                                 "--master-bind-host", "127.0.0.1", "--master-bind-port", port, "-u", "1", "-r", "1",
                                 "--host", url, "--trace", trace, "--run-dir", tmp_path / "run", "--no-check",
                                 "--no-progress", "--model-map", "*=m", "--csv", tmp_path / "locust"))
            procs.append(_locust(tmp_path / "worker.log", "--worker", "--master-host", "127.0.0.1",
                                 "--master-port", port, locustfile=worker_file))
            master, worker = procs
            assert master.wait(wait_s(60)) == 0, (tmp_path / "master.log").read_text()[-3000:]
            assert worker.wait(wait_s(30)) == 0, (tmp_path / "worker.log").read_text()[-3000:]  # it leaves with the master
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    df = records(tmp_path / "run")
    assert len(df) == n and set(df.request_id) == {str(i) for i in range(n)}
    assert (df.status == "ok").all(), df.status.value_counts()
    assert_well_formed(df)
    assert (df.worker == 0).all() and (df.completion_tokens == 5).all()
    info = run_info(tmp_path / "run")
    assert info["status"] == "completed" and info["status_counts"] == {"ok": n} and info["workers"] == 1
    with open(tmp_path / "locust_stats.csv") as f:
        stats = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    for kind in ("E2E", "TTFT"):
        assert int(stats[kind, "all"]["Request Count"]) == n and int(stats[kind, "all"]["Failure Count"]) == 0, stats
    assert int(stats["", "Aggregated"]["Request Count"]) == n, stats  # requests, not requests + TTFTs


def _locust(log: Path, *args, locustfile=LOCUSTFILE) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "locust", "-f", str(locustfile), *map(str, args)],
                                env=repo_env(), stdout=f, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_web_ui_binds_loopback_stops_on_ctrl_c_and_a_dead_target_is_one_line(tmp_path):
    """Issue 23 items 2 and 4: Locust's web UI (which starts load against the target, no login)
    listens on 127.0.0.1 unless --web-host says otherwise; Ctrl-C ends it; a target that cannot be
    reached is one `error:` line and exit 2, not a traceback."""
    import signal
    import time

    import psutil

    from tests.conftest import free_port
    trace = write_trace(tmp_path / "t.parquet", 5, gap_s=0.05)
    port = free_port()
    ui = _locust(tmp_path / "ui.log", "--host", "http://127.0.0.1:9", "--trace", trace, "--run-dir", tmp_path / "ui",
                 "--web-port", port, "--no-check", "--model-map", "*=m")
    try:
        deadline = time.monotonic() + wait_s(60)
        while not [c for c in psutil.Process(ui.pid).net_connections("tcp") if c.status == "LISTEN"
                   and c.laddr.port == port]:
            assert time.monotonic() < deadline and ui.poll() is None, (tmp_path / "ui.log").read_text()
            time.sleep(0.2)
        bound = {c.laddr.ip for c in psutil.Process(ui.pid).net_connections("tcp") if c.laddr.port == port}
        assert bound == {"127.0.0.1"}, bound
        ui.send_signal(signal.SIGINT)
        assert ui.wait(wait_s(30)) == 0
    finally:
        if ui.poll() is None:
            ui.kill()
    dead = subprocess.run([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host",
                          f"http://127.0.0.1:{free_port()}", "--trace", str(trace), "-t", "5s"],
                         env=repo_env(), capture_output=True, text=True, timeout=wait_s(120))
    assert dead.returncode == 2 and "Traceback" not in dead.stderr, dead.stderr
    assert dead.stderr.strip().splitlines()[-1].startswith("error: target http://127.0.0.1:"), dead.stderr
