"""Where the runner is scheduled (issue 21): in the caller's session and CPU group, never a new
session (a new session is a CPU group of its own under scheduler autogroups, and a fresh group
on a busy host waited 30-165 ms for its wake-ups); `--nice` raises it and its group for the run
only; the /metrics scraper is a niced process of its own, off the runner's event loop."""
from __future__ import annotations

import os
import time

import psutil
import pytest

from llm_replay.replay.parent import autogroup, autogroups_on
from tests.replay.runkit import popen_run, records, run_info, sse_server, wait_t0, write_trace
from tests.conftest import wait_s


def _processes(run) -> tuple[psutil.Process, list[psutil.Process]]:
    """The runner and the scraper (replay run's children), once both are up."""
    deadline = time.monotonic() + wait_s(120)
    while time.monotonic() < deadline:
        kids = psutil.Process(run.pid).children()
        runner = [p for p in kids if "llm_replay.replay.runner" in " ".join(p.cmdline())]
        scraper = [p for p in kids if "llm_replay.replay.scrape" in " ".join(p.cmdline())]
        if runner and scraper:
            return runner[0], scraper
        time.sleep(0.05)
    raise AssertionError("no runner (or no scraper) appeared")


def test_runner_in_the_callers_session_and_group_scraper_niced_apart(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 40, gap_s=0.05, output_tokens=4)
    with sse_server("--interval", "0.005") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m",
                        "--scrape", f"{url}/metrics", "--scrape-interval", "200ms")
        runner, scraper = _processes(run)
        wait_t0(tmp_path / "run", proc=run)
        assert os.getsid(runner.pid) == os.getsid(run.pid) == os.getsid(0)     # the old code: a new session
        assert os.getpgid(runner.pid) == runner.pid != os.getpgid(run.pid)     # its own group: signals
        if autogroups_on():
            assert autogroup(runner.pid) == autogroup(run.pid) == autogroup(os.getpid())
        assert len(scraper) == 1 and scraper[0].nice() >= 5 > runner.nice()
        out, err = run.communicate(timeout=wait_s(60))
    assert run.returncode == 0, err
    sched = run_info(tmp_path / "run")["scheduling"]
    assert sched["session"] == "caller" and sched["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert sched["autogroups"] == autogroups_on() and not sched["errors"]
    assert len(records(tmp_path / "run")) == 40
    assert (tmp_path / "run" / "server_metrics.parquet").exists()
    assert not (tmp_path / "run" / "server_metrics.arrows").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority (nice < 0) needs root or CAP_SYS_NICE")
def test_nice_raises_the_runner_and_its_group_for_the_run_only(tmp_path):
    before = autogroup(os.getpid())
    trace = write_trace(tmp_path / "t.parquet", 30, gap_s=0.05, output_tokens=4)
    with sse_server("--interval", "0.005") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--nice", "-5")
        wait_t0(tmp_path / "run", proc=run)
        runner = [p for p in psutil.Process(run.pid).children() if "replay.runner" in " ".join(p.cmdline())][0]
        assert runner.nice() == -5
        if before is not None and autogroups_on():
            assert autogroup(os.getpid())[1] == -5                 # the session's CPU group, meanwhile
        out, err = run.communicate(timeout=wait_s(60))
    assert run.returncode == 0, err
    assert autogroup(os.getpid()) == before                        # restored after the run
    sched = run_info(tmp_path / "run")["scheduling"]
    assert sched["nice"] == -5 and sched["nice_asked"] == -5 and not sched["errors"]


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root or CAP_SYS_NICE")
def test_realtime_runs_the_runner_under_sched_fifo(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 20, gap_s=0.05, output_tokens=4)
    with sse_server("--interval", "0.005") as url:
        run = popen_run(trace, url, tmp_path / "run", "--model-map", "*=m", "--realtime")
        wait_t0(tmp_path / "run", proc=run)
        runner = [p for p in psutil.Process(run.pid).children() if "replay.runner" in " ".join(p.cmdline())][0]
        assert os.sched_getscheduler(runner.pid) == os.SCHED_FIFO
        assert os.sched_getscheduler(run.pid) != os.SCHED_FIFO      # only the runner
        out, err = run.communicate(timeout=wait_s(60))
    assert run.returncode == 0, err
    sched = run_info(tmp_path / "run")["scheduling"]
    assert sched["policy"] == "fifo" and not sched["errors"]
