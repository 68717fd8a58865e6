"""Multi-host, proven on one machine: network namespaces joined by veth pairs to a bridge stand
for the hosts. The master (`replay run --remote-workers 2`, with its one local worker) runs in
one, a `replay worker --master` in each of two others and the target (the SSE test server) in a
fourth; every packet between them crosses a veth pair and the bridge of a fifth, the hub, on a
private subnet that exists only inside these namespaces. Nothing touches the host's interfaces.

Needs root and `ip` (iproute2) with netns/veth/bridge support; skipped with the reason otherwise.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from llm_replay.replay.recorder import read_stream
from tests.conftest import REPO, repo_env, wait_s
from tests.replay.runkit import assert_well_formed, records, run_info, wait_t0, write_trace

NET = "10.231.0"        # the test hosts' subnet: only inside the namespaces built here
ADDR = {"master": f"{NET}.1", "w1": f"{NET}.11", "w2": f"{NET}.12", "target": f"{NET}.20"}
TARGET_PORT, MASTER_PORT = 8000, 5557


class SetupRefused(Exception):
    pass


class Hosts:
    """Namespaces lr-<pid>-{hub,master,w1,w2,target}; `start(role, argv)` runs a process in one."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.prefix = f"lr-{os.getpid()}"
        self.made: list[str] = []
        self.procs: dict[str, list[subprocess.Popen]] = {}
        self.logs: dict[str, Path] = {}
        self.files: dict = {}

    def ns(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    @staticmethod
    def ip(*args: str) -> None:
        p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=wait_s(20))
        if p.returncode != 0:
            raise SetupRefused(f"`ip {' '.join(args)}` failed ({p.returncode}): {p.stderr.strip()}")

    def build(self) -> None:
        hub = self.ns("hub")
        for role in ("hub", *ADDR):
            # a namespace of this name is a leftover of an earlier run of ours with the same pid
            subprocess.run(["ip", "netns", "del", self.ns(role)], capture_output=True, timeout=wait_s(20))
            self.ip("netns", "add", self.ns(role))
            self.made.append(self.ns(role))
        self.ip("-n", hub, "link", "set", "lo", "up")
        self.ip("-n", hub, "link", "add", "br0", "type", "bridge")
        self.ip("-n", hub, "link", "set", "br0", "up")
        for role, addr in ADDR.items():
            ns, port = self.ns(role), f"v-{role}"
            # both ends created inside the namespaces: the pair never exists in the root namespace
            self.ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.ip("-n", hub, "link", "set", port, "master", "br0")
            self.ip("-n", hub, "link", "set", port, "up")
            self.ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")

    def start(self, role: str, name: str, argv: list[str], **kw) -> subprocess.Popen:
        """`ip netns exec` execs the command itself: the Popen's pid is the process's."""
        if "stdout" not in kw:
            log = self.logs[name] = self.tmp / f"{name}.log"
            kw["stdout"] = self.files[name] = open(log, "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(role), sys.executable, *argv], cwd=REPO,
                             env=repo_env(), text=True, stderr=subprocess.STDOUT, **kw)
        self.procs.setdefault(role, []).append(p)
        return p

    def pids(self, role: str) -> list[int]:
        p = subprocess.run(["ip", "netns", "pids", self.ns(role)], capture_output=True, text=True, timeout=wait_s(20))
        return [int(x) for x in p.stdout.split()]

    def kill(self, role: str) -> list[int]:
        """SIGKILL every process of that host (its namespace)."""
        pids = self.pids(role)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs.get(role, []):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        return pids

    def log(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def dump(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-3000:]}" for name in self.logs)

    def teardown(self) -> None:
        for role in reversed(list(self.procs)):
            self.kill(role)
        for ns in reversed(self.made):
            for pid in self.pids(ns.removeprefix(self.prefix + "-")):   # anything left in it
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=wait_s(20))
        self.made.clear()
        for f in self.files.values():
            f.close()


@pytest.fixture
def hosts(tmp_path):
    if sys.platform != "linux" or shutil.which("ip") is None:
        pytest.skip("needs Linux and iproute2's `ip` for network namespaces")
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces (ip netns add)")
    h = Hosts(tmp_path)
    try:
        h.build()
    except (SetupRefused, OSError, subprocess.TimeoutExpired) as e:
        h.teardown()
        pytest.skip(f"the kernel refused the test hosts: {e}")
    try:
        yield h
    finally:
        h.teardown()


# --- the run -------------------------------------------------------------------------

def start_target(h: Hosts) -> tuple[str, Path]:
    conn_log = h.tmp / "conn.log"
    p = h.start("target", "target", ["-m", "tests.replay.sse_server", "--host", ADDR["target"],
                                     "--port", str(TARGET_PORT), "--interval", "0.01",
                                     "--conn-log", str(conn_log)], stdout=subprocess.PIPE)
    deadline = time.monotonic() + wait_s(30)
    while time.monotonic() < deadline and p.poll() is None:
        if select.select([p.stdout], [], [], 0.5)[0]:
            line = p.stdout.readline()
            if line.startswith("sse-server ready: "):
                return line.split(": ", 1)[1].strip(), conn_log
    raise AssertionError(f"the target did not start in its namespace (exit {p.poll()})")


def start_run(h: Hosts, trace: Path, url: str, run_dir: Path) -> subprocess.Popen:
    """The master with one local worker (`--workers` counts the master host's own workers,
    at least 1) and two remote ones, bound to the master host's address only."""
    master = h.start("master", "master", [
        "-m", "llm_replay.replay", "run", "--trace", str(trace), "--target", url, "-o", str(run_dir),
        "--no-check", "--no-progress", "--model-map", "*=m", "--workers", "1", "--remote-workers", "2",
        "--master-bind", f"{ADDR['master']}:{MASTER_PORT}"])
    for w in ("w1", "w2"):
        h.start(w, w, ["-m", "llm_replay.replay", "worker", "--master", f"{ADDR['master']}:{MASTER_PORT}"])
    return master


def worker_index(h: Hosts, name: str, timeout: float = 120) -> int:
    """Which worker k the master made of the `replay worker` on host `name` (from what it says)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"replaying as worker (\d+) of 3: target http://" + re.escape(ADDR["target"]), h.log(name))
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise AssertionError(f"{name} never started replaying\n{h.dump()}")


def wait(p: subprocess.Popen, h: Hosts, timeout: float) -> int:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"did not finish within {timeout} s\n{h.dump()}") from None


def peers(conn_log: Path) -> dict[str, int]:
    """Connections the target accepted, by peer address."""
    out: dict[str, int] = {}
    for line in conn_log.read_text().splitlines():
        m = re.match(r"\('([\d.]+)', \d+\)", line)
        assert m, line
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def records_so_far(run_dir: Path):
    """The records the master has written to records.arrows so far (a stream still being written)."""
    batches = list(read_stream(run_dir / "records.arrows"))
    return pa.Table.from_batches(batches).to_pandas() if batches else None


def multihost_trace(tmp: Path, n: int, gap_s: float) -> Path:
    # 20 tokens at 10 ms: every request streams for ~0.2 s, so ~10 are in flight at any time
    return write_trace(tmp / "t.parquet", n, gap_s=gap_s, output_tokens=20,
                       request_id=[f"r{i}" for i in range(n)])


# --- the tests -----------------------------------------------------------------------

def launch(h, n: int):
    """The target, then the master and both worker hosts on an n-row trace (20 ms apart):
    (run_dir, conn_log, master process, start time, w1's and w2's worker index)."""
    trace = multihost_trace(h.tmp, n, gap_s=0.02)
    url, conn_log = start_target(h)
    run_dir = h.tmp / "run"
    t = time.monotonic()
    master = start_run(h, trace, url, run_dir)
    return run_dir, conn_log, master, t, worker_index(h, "w1"), worker_index(h, "w2")


@pytest.mark.slow
def test_three_hosts_replay_one_trace(hosts):
    h, n = hosts, 200    # 4 s of trace
    run_dir, conn_log, master, t, k1, k2 = launch(h, n)
    assert wait(master, h, 90) == 0, h.dump()
    took = time.monotonic() - t
    for w in ("w1", "w2"):   # remote workers leave by themselves when the master ends the run
        assert wait(h.procs[w][0], h, 30) == 0, h.dump()

    info = run_info(run_dir)
    assert info["status"] == "completed" and info["status_counts"] == {"ok": n}, info
    assert info["workers"] == 3 and "lost_workers" not in info
    df = records(run_dir)      # the master's merged records of all three workers
    assert len(df) == n and set(df.request_id) == {f"r{i}" for i in range(n)}
    assert (df.status == "ok").all(), df.status.value_counts()
    assert (df.completion_tokens == 20).all()
    assert_well_formed(df)
    # round-robin sharding: row i to worker i % 3, so every worker's share is n/3 within one
    idx = df.request_id.str[1:].astype(int)
    assert (df.worker == idx % 3).all(), "rows are sharded round-robin"
    shares = df.worker.value_counts().to_dict()
    assert sorted(shares) == [0, 1, 2] and max(shares.values()) - min(shares.values()) <= 1, shares
    assert {k1, k2} < {0, 1, 2} and k1 != k2
    for w, k in (("w1", k1), ("w2", k2)):   # each remote worker sent exactly its share, none failed
        said = h.log(w)
        assert re.search(rf"worker {k} done: {shares[k]} requests sent, 0 failed", said), said
        assert f"master {ADDR['master']}:{MASTER_PORT} ended the run; exiting" in said
        assert "Traceback" not in said
    # the traffic crossed the hosts: the target saw the workers' own addresses, never loopback
    seen = peers(conn_log)
    assert {ADDR["w1"], ADDR["w2"], ADDR["master"]} == set(seen), seen
    print(f"\nmultihost: {n} rows, shares {shares}, connections by peer {seen}, run took {took:.1f} s")


@pytest.mark.slow
def test_killed_worker_host_rows_are_accounted(hosts):
    h, n = hosts, 600    # 12 s of trace; host w2 is killed ~1.5 s in, Locust misses it ~4 s later
    run_dir, conn_log, master, t, k1, k2 = launch(h, n)
    t0 = wait_t0(run_dir, timeout=60)
    # kill once T0 + 1.5 s has passed and some of w2's records reached the master
    deadline = t0 + 8
    while True:
        now = time.time()
        df = records_so_far(run_dir) if now >= t0 + 1.5 else None
        if df is not None and (df.worker == k2).sum() >= 5:
            break
        assert now < deadline, f"no records of worker {k2} by T0 + 8 s\n{h.dump()}"
        time.sleep(0.05)
    before = set(df[df.worker == k2].request_id)
    killed = h.kill("w2")
    kill_s = time.time() - t0
    assert killed and h.pids("w2") == [], "every process of host w2 is gone"
    assert wait(master, h, 90 - (time.monotonic() - t)) == 1, h.dump()   # ends by itself, lost a worker: 1
    took = time.monotonic() - t
    assert wait(h.procs["w1"][0], h, 30) == 0, h.dump()

    said = h.log("master")
    assert f"worker {k2} went missing" in said, said
    info = run_info(run_dir)
    assert info["status"] == "worker_lost" and info["lost_workers"] == [k2], info
    df = records(run_dir)
    assert len(df) == n and set(df.request_id) == {f"r{i}" for i in range(n)}, "one record per row"
    assert_well_formed(df)
    assert (df.worker == df.request_id.str[1:].astype(int) % 3).all()
    mine, others = df[df.worker == k2], df[df.worker != k2]
    assert (others.status == "ok").all(), others.status.value_counts()   # the survivors carried on
    assert re.search(rf"worker {k1} done: {(df.worker == k1).sum()} requests sent, 0 failed", h.log("w1"))
    lost = mine[mine.status != "ok"]
    ok = mine[mine.status == "ok"]
    assert before <= set(ok.request_id), "records that reached the master before the kill are kept"
    assert (lost.error == f"worker {k2} lost").all(), lost.error.value_counts(dropna=False)
    assert lost.status.isin(["cancelled", "not_sent"]).all()
    # nothing the dead host was to send after its death was sent; what was due before was cancelled
    assert (ok.sent_s < kill_s + 0.05).all(), (ok.sent_s.max(), kill_s)
    assert (mine[mine.scheduled_s > kill_s + 0.05].status != "ok").all()
    cancelled, not_sent = lost[lost.status == "cancelled"], lost[lost.status == "not_sent"]
    assert len(cancelled) and len(not_sent), lost.status.value_counts()
    assert cancelled.scheduled_s.max() <= not_sent.scheduled_s.min(), "due at detection: cancelled; later: not_sent"
    assert (lost[lost.scheduled_s < kill_s].status == "cancelled").all()
    assert not_sent.sent_s.isna().all()
    assert np.isclose(len(mine), n / 3, atol=1)
    seen = peers(conn_log)
    assert ADDR["w2"] in seen and "127.0.0.1" not in seen, seen
    print(f"\nmultihost kill: worker {k2} killed at T0+{kill_s:.1f} s; {len(ok)} ok, {len(cancelled)} cancelled, "
          f"{len(not_sent)} not_sent of its {len(mine)} rows; run took {took:.1f} s")
