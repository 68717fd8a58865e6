"""Helpers for the runner tests: traces on disk, the SSE test server, runs and their records."""
from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import repo_env, run_cli, wait_s
from llm_replay.traces.trace import Trace


def write_trace(path: Path, n: int, gap_s: float = 0.005, input_tokens: int = 20, output_tokens: int = 6,
                **cols) -> Path:
    data = {"arrival_ns": pa.array((np.arange(n) * gap_s * 1e9).astype("int64")),
            "input_tokens": pa.array(np.full(n, input_tokens), pa.int32()),
            "output_tokens": pa.array(np.full(n, output_tokens), pa.int32())}
    data.update({k: pa.array(v) for k, v in cols.items()})
    Trace(pa.table(data)).write(path)
    return path


@contextmanager
def sse_server(*args: str, port: int = 0):
    """The client's SSE test server (`tests.replay.sse_server`) as a subprocess; yields its URL."""
    proc = start_sse(*args, port=port)
    try:
        yield proc.url
    finally:
        stop(proc)


def start_sse(*args: str, port: int = 0) -> subprocess.Popen:
    """The SSE test server in its own session, as a server is (tests/conftest.py)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.replay.sse_server", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=repo_env(),
                            start_new_session=True)
    deadline = time.monotonic() + wait_s(20)
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            line = proc.stdout.readline()
            if line.startswith("sse-server ready: "):
                proc.url = line.split(": ", 1)[1].strip()
                return proc
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("sse_server did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


def replay_run(trace: Path, target: str, out: Path, *args: str, timeout: float = 90,
               check: bool = True) -> subprocess.CompletedProcess:
    return run_cli("replay", "run", "--trace", trace, "--target", target, "-o", out, "--no-check",
                   "--no-progress", *args, timeout=timeout, check=check)


def popen_run(trace: Path, target: str, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llm_replay.replay", "run", "--trace", str(trace), "--target", target,
                             "-o", str(out), "--no-check", "--no-progress", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=repo_env())


def records(run_dir: Path):
    return pq.read_table(Path(run_dir) / "records.parquet").to_pandas()


def run_info(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def assert_well_formed(df) -> None:
    """Invariants every record set must hold."""
    assert df.request_id.is_unique
    ok = df[df.status == "ok"]
    for tt in ok.token_times:
        assert len(tt) > 0 and (np.diff(tt) >= 0).all() and tt[0] >= 0
    assert (ok.first_token_s >= ok.sent_s).all() and (ok.last_token_s >= ok.first_token_s).all()
    sent = df[df.sent_s.notna()]
    assert (sent.sent_s - sent.scheduled_s > -0.002).all(), "sent before due"
    assert df[df.status == "not_sent"].sent_s.isna().all()


def wait_t0(run_dir: Path, timeout: float = 120, proc: subprocess.Popen | None = None) -> float:
    """Wait until the runner has fixed T0 (`timeout`: a quiet host's; no longer once `proc` has
    exited); return it (wall clock)."""
    deadline = time.monotonic() + wait_s(timeout)
    while True:
        ended = proc is not None and proc.poll() is not None
        try:
            t0 = run_info(run_dir).get("t0_wall")
            if t0:
                return t0
        except (OSError, ValueError):
            pass
        if ended or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise AssertionError("the run never reached T0" + (f": it exited {proc.returncode}\n{proc.stderr.read()[-3000:]}"
                                                       if ended else ""))
