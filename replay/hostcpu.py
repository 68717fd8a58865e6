"""CPU samples of a run: the client's processes and the host's, every 0.1 s, from /proc.

A late send has two very different causes: the client saturated its core (add workers, lower
the rate), or the host did not run it (the hypervisor stole the CPU, or other processes, a
server on the same machine, held every core). Only the time series tell them apart, so
`replay run` samples them beside its runner, in its own otherwise idle parent process (nothing
on the runner's hot path): per sample, the client's CPU (the runner and its worker processes,
in cores, and the busiest single one of them, since each is one event loop), the host's busy
and stolen cores from /proc/stat, and how long tasks waited for a CPU (/proc/pressure/cpu). `reports.validity` reads `cpu.parquet` against the records.
Linux only; elsewhere nothing is sampled and the reports say the cause is unknown.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
CPU_FILE = "cpu.parquet"


def host_ticks() -> tuple[int, int] | None:
    """(busy, steal) ticks of the whole host; busy excludes idle and iowait, includes steal."""
    try:
        with open("/proc/stat", "rb") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = v[7] if len(v) > 7 else 0
    return sum(v[:8]) - v[3] - v[4], steal


def _pressure() -> int | None:
    """Microseconds during which some task waited for a CPU (PSI, Linux >= 4.20), host-wide."""
    try:
        with open("/proc/pressure/cpu", "rb") as f:
            return int(f.readline().rsplit(b"total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _proc(pid: int) -> int | None:
    """utime + stime ticks of one process (its threads included)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


class CpuSampler:
    """Samples `root` (the runner) and its child processes (local workers) against the host."""

    def __init__(self, root: int, period: float = 0.1) -> None:
        self.root, self.period = root, period
        self.ok = host_ticks() is not None and _proc(root) is not None
        self.ncpu = os.cpu_count() or 1
        self.rows: list[tuple[float, float, float, float, float, float]] = []
        self._pids: list[int] = [root]
        self._last: tuple[float, tuple[int, int], dict[int, int], int | None] | None = None
        self._next_scan = 0.0
        self.due = time.monotonic()

    def sample(self) -> None:
        """One sample: the CPU each process and the host used since the previous one."""
        now = time.monotonic()
        self.due = now + self.period
        if now >= self._next_scan:   # workers start after the runner: look for them once a second
            self._pids = [self.root, *_children(self.root)]
            self._next_scan = now + 1.0
        host, psi = host_ticks(), _pressure()
        procs = {p: t for p in self._pids if (t := _proc(p)) is not None}
        if host is None:
            return
        if self._last is not None:
            t0, h0, p0, psi0 = self._last
            dt = now - t0
            per = [(t - p0[p]) * TICK / dt for p, t in procs.items() if p in p0]
            waiting = (psi - psi0) * 1e-6 / dt if psi is not None and psi0 is not None else float("nan")
            self.rows.append((time.time() - dt / 2, sum(per), max(per, default=0.0),
                              (host[0] - h0[0]) * TICK / dt, (host[1] - h0[1]) * TICK / dt, waiting))
        self._last = (now, host, procs, psi)

    def write(self, run_dir: str | Path, t0_wall: float) -> Path | None:
        """cpu.parquet: time_s (from T0, the middle of each interval), client_cores,
        client_max_cores, busy_cores (the host's, client included), steal_cores, cpu_wait_share
        (the share of the interval in which some task waited for a CPU: PSI; NaN without it);
        ncpu in the metadata. None when nothing was sampled."""
        if not self.rows:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq
        t, client, top, busy, steal, waiting = zip(*self.rows)
        table = pa.table({"time_s": pa.array([x - t0_wall for x in t], pa.float64()),
                          "client_cores": pa.array(client, pa.float32()),
                          "client_max_cores": pa.array(top, pa.float32()),
                          "busy_cores": pa.array(busy, pa.float32()),
                          "steal_cores": pa.array(steal, pa.float32()),
                          "cpu_wait_share": pa.array(waiting, pa.float32())})
        path = Path(run_dir) / CPU_FILE
        pq.write_table(table.replace_schema_metadata({"ncpu": str(self.ncpu), "period_s": str(self.period)}), path)
        return path
