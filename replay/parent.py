"""The parent process of `replay run`: the run directory, the children it owns, the wrap-up.

`claim_run_dir`/`prepare_run_dir` make the run directory and its run.json; `supervise` runs the
runner (`python -m llm_replay.replay.runner RUN_DIR`, the only process that imports
locust/gevent) beside the `--scrape` sampler, forwards Ctrl-C/SIGTERM to it once (a second one
skips the grace time), samples the host's CPU while it waits (`CpuSampler`) and, with
--until-decided, stops it at the gate's first decided look; `Priority` is how the runner is
scheduled (its process group, --nice, --realtime). After it, `RunInfo` (run.json, read once) is updated by the
wrap-up steps: `salvage_if_died`, `finish_receiver` (--otlp), `verdict`, `summarize`.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import __version__
from .preflight import RunError

MAX_ERROR_RATE = 0.5   # --max-error-rate: above it, a completed run exits 1
UNWRITABLE = 3         # the runner's exit code when the run directory could not be written
STOP_MARGIN_S = 15.0   # after a forwarded Ctrl-C/SIGTERM and the grace time, a stuck runner is killed
REALTIME_PRIORITY = 1   # the lowest SCHED_FIFO priority: above every normal task, below the kernel's own
TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)   # seconds per /proc CPU tick


def claim_run_dir(out: str | None) -> tuple[Path, bool]:
    """Make the run directory (default runs/<UTC time>, -2, -3... when taken) and create its run.json
    exclusively, before anything is sent or written: of two runs given one -o, one gets it and the
    other an error. Returns the directory and whether it was made here."""
    base = out or f"runs/{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    run_dir, k = Path(base), 1
    while out is None and run_dir.exists() and k < 100:
        k += 1
        run_dir = Path(f"{base}-{k}")
    made = not run_dir.exists()
    if not made and not run_dir.is_dir():
        raise RunError(f"-o {run_dir}: that is a file, not a run directory; choose another -o")
    if any((run_dir / f).exists() for f in ("records.parquet", "records.arrows")):
        raise RunError(f"{run_dir} already holds a run; choose another -o")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / "run.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise RunError(f"{run_dir} already holds a run (its run.json: another `replay run`?); choose another -o") from None
    except OSError as e:   # a file on the way, no permission, a full disk
        raise RunError(f"-o {run_dir}: cannot make it ({e.strerror}: {e.filename}); choose another -o") from None
    with os.fdopen(fd, "w") as f:
        f.write("{}\n")
    return run_dir, made


def release_run_dir(run_dir: Path, made: bool) -> None:
    """Nothing was run: the directory is free again."""
    (run_dir / "run.json").unlink(missing_ok=True)
    (run_dir / "trace.parquet").unlink(missing_ok=True)
    if made and not any(run_dir.iterdir()):
        run_dir.rmdir()


def prepare_run_dir(config, notes: dict, claimed: bool = False) -> None:
    """Write run.json (config without secrets, trace hash, host...) into the run directory,
    claimed here unless `claimed` (by `claim_run_dir`)."""
    from . import plan
    from .output import update_run_json
    run_dir = Path(config.run_dir)
    if not claimed:
        claim_run_dir(str(run_dir))
    trace = {"path": str(Path(config.trace).resolve()), "sha256": plan.sha256_file(config.trace), "rows": config.rows}
    update_run_json(run_dir, config=config.to_json(), target=config.target, trace=trace,
                    tool={"name": "llm-replay", "version": __version__, "python": platform.python_version()},
                    host=platform.node(), workers=config.workers + config.remote_workers,
                    started_wall=time.time(), status="running", **notes)


def start_receiver(address: str, token: str | None):
    """--otlp: the span receiver, listening before the run starts. A taken port fails here: the
    server exports to the address it was given, so another port would silently receive nothing."""
    from .otlp import PATH, Receiver, is_loopback, parse_address
    try:
        host, port = parse_address(address)
        if not token and not is_loopback(host):
            raise ValueError(f"--otlp {address}: beyond loopback anyone could post spans; set REPLAY_OTLP_TOKEN "
                             "(or --otlp-token) and the server's OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20TOKEN")
        rec = Receiver(host, port, token or None)
    except ValueError as e:
        raise RunError(str(e)) from None
    except OSError as e:
        raise RunError(f"--otlp {address}: cannot receive spans there ({e.strerror or e}); choose a free --otlp HOST:PORT "
                       "(HOST:0: any) and point the server's traces endpoint there") from None
    print(f"replay: otlp: receiving spans at http://{rec.address}{PATH} " + ("(token required)" if token else
          "(unauthenticated: any local process can post spans; --otlp-token sets a secret)"), file=sys.stderr)
    return rec


def warn_realtime_beside(urls: list[str]) -> None:
    """--realtime next to the server it measures takes CPU from that server (vLLM's TPOT +34/+49%)."""
    import socket
    from urllib.parse import urlsplit
    for url in filter(None, urls):
        host = urlsplit(url).hostname or ""
        try:
            addrs = {a[4][0] for a in socket.getaddrinfo(host, None)}
        except OSError:
            continue
        for addr in addrs:
            try:   # this host's own address (loopback included): one a socket can bind
                with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
                    s.bind((addr, 0))
            except OSError:
                continue
            print(f"replay: warning: --realtime with a target on this host ({host}) takes CPU from the server it "
                  "measures; pin them to different cores or leave --realtime out", file=sys.stderr)
            return


def _read(path, parse):
    """parse(the open file) of a /proc (or /sys) file; None where it is missing or not as expected."""
    try:
        with open(path, "rb") as f:
            return parse(f)
    except (OSError, ValueError, IndexError):
        return None


def autogroups_on() -> bool | None:
    """Whether the kernel groups CPU time by session (None: not Linux, or unknown)."""
    return _read("/proc/sys/kernel/sched_autogroup_enabled", lambda f: f.read().strip() == b"1")


def autogroup(pid: int | str = "self") -> tuple[str, int] | None:
    """(group name, group nice) of a process, from /proc/PID/autogroup ('/autogroup-57 nice 0')."""
    def parse(f):
        name, _, nice = f.read().decode().split()
        return name, int(nice)
    return _read(f"/proc/{pid}/autogroup", parse)


def _set_autogroup_nice(nice: int) -> str | None:
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError as e:
        return f"autogroup nice {nice}: {e.strerror or e}"


class Priority:
    """The runner's scheduling: apply `nice` (None: leave it) in the child before exec, raise
    the session's autogroup while the run lasts, and describe what was in force.

    The runner stays in the caller's session, in a process group of its own (so Ctrl-C at a
    terminal reaches `replay run`, which forwards it once). A new session would be worse: with
    scheduler autogroups on (Linux's default: /proc/sys/kernel/sched_autogroup_enabled = 1) each
    session is its own CPU group, and a fresh group on a busy host waited 30-165 ms for its
    wake-ups (issue 21). Within an autogroup a process's nice value only orders it against the
    group's other processes; against other sessions the group's own nice counts
    (/proc/<pid>/autogroup). So `--nice N` sets both: the runner's (its workers inherit it) and,
    for the run's duration, the session's autogroup's; lowering either below 0 needs root or
    CAP_SYS_NICE, and a refusal is reported, never fatal. Measured on a 2-core Linux 6.18 host
    (HZ=250) under three busy processes (benchmarks/contention.py), a woken normal task waits for
    the next scheduler tick (lag p99 ~4 ms, in the caller's session or a new one alike), and nice
    does not change that reliably; `--realtime` (SCHED_FIFO 1, same permissions) preempts at once
    (lag p99 0.6-0.9 ms). A runner that saturates its core under SCHED_FIFO can hold it from normal
    tasks up to the kernel's real-time throttling (95 % by default), so it is opt-in. run.json
    `scheduling` says what the runner ran with, and the report repeats it when the replay fell
    behind its schedule.
    """

    def __init__(self, nice: int | None, realtime: bool = False) -> None:
        self.nice, self.realtime = nice, realtime
        self.errors: list[str] = []
        self._restore: int | None = None

    def before_start(self) -> None:
        """In `replay run` (the runner's session): the autogroup's nice for the run."""
        group = autogroup() if self.nice is not None and autogroups_on() else None
        if group is not None and group[1] != self.nice:
            err = _set_autogroup_nice(self.nice)
            if err:
                self.errors.append(err)
            else:
                self._restore = group[1]

    def in_child(self) -> None:
        """preexec_fn of the runner: its own process group (same session) and its nice."""
        os.setpgid(0, 0)
        try:
            if self.nice is not None:
                os.setpriority(os.PRIO_PROCESS, 0, self.nice)
            if self.realtime:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        except OSError:
            pass   # reported from the parent, which sees what the child really has

    def after_start(self, pid: int) -> dict:
        """run.json `scheduling`: session, autogroups, the runner's nice and its group's."""
        try:
            nice = os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            nice = None
        if self.nice is not None and nice is not None and nice != self.nice:
            self.errors.append(f"--nice {self.nice}: not permitted (nice {nice}); below 0 needs root or CAP_SYS_NICE")
        try:
            policy = "fifo" if os.sched_getscheduler(pid) == os.SCHED_FIFO else "normal"
        except (OSError, AttributeError):
            policy = None
        if self.realtime and policy != "fifo":
            self.errors.append("--realtime: needs root or CAP_SYS_NICE; the runner runs under the normal policy")
        group, group_nice = autogroup(pid) or (None, None)
        same = os.getsid(pid) == os.getsid(0) if hasattr(os, "getsid") else None
        return {"session": "caller" if same else "own", "autogroups": autogroups_on(), "policy": policy, "autogroup": group,
                "autogroup_nice": group_nice, "nice": nice, "nice_asked": self.nice, "errors": self.errors}

    def restore(self) -> None:
        if self._restore is not None:
            _set_autogroup_nice(self._restore)
            self._restore = None


def host_ticks() -> tuple[int, int] | None:
    """(busy, steal) ticks of the whole host; busy excludes idle and iowait, includes steal."""
    v = _read("/proc/stat", lambda f: [int(x) for x in f.readline().split()[1:]])
    if v is None:
        return None
    return sum(v[:8]) - v[3] - v[4], (v[7] if len(v) > 7 else 0)


def _pressure() -> int | None:
    """Microseconds during which some task waited for a CPU (PSI, Linux >= 4.20), host-wide."""
    return _read("/proc/pressure/cpu", lambda f: int(f.readline().rsplit(b"total=", 1)[1]))


def _proc(pid: int) -> int | None:
    """utime + stime ticks of one process (its threads included)."""
    def parse(f):
        fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    return _read(f"/proc/{pid}/stat", parse)


def _children(pid: int) -> list[int]:
    return _read(f"/proc/{pid}/task/{pid}/children", lambda f: [int(x) for x in f.read().split()]) or []


class CpuSampler:
    """Samples `root` (the runner) and its child processes (local workers) against the host,
    every 0.1 s, from /proc.

    A late send has two very different causes: the client saturated its core (add workers, lower
    the rate), or the host did not run it (the hypervisor stole the CPU, or other processes, a
    server on the same machine, held every core). Only the time series tell them apart, so
    `replay run` samples them beside its runner, in its own otherwise idle parent process (nothing
    on the runner's hot path): per sample, the client's CPU (the runner and its worker processes,
    in cores, and the busiest single one of them, since each is one event loop), the host's busy
    and stolen cores from /proc/stat, and how long tasks waited for a CPU (/proc/pressure/cpu).
    `reports.validity` reads `cpu.parquet` against the records. Linux only; elsewhere nothing is
    sampled and the reports say the cause is unknown.
    """

    def __init__(self, root: int, period: float = 0.1) -> None:
        self.root, self.period = root, period
        self.ok = host_ticks() is not None and _proc(root) is not None
        self.ncpu = os.cpu_count() or 1
        self.rows: list[tuple[float, float, float, float, float, float]] = []
        self._pids: list[int] = [root]
        self._last: tuple[float, tuple[int, int], dict[int, int], int | None] | None = None
        self._next_scan, self.due = 0.0, time.monotonic()

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

    def write(self, run_dir: str | Path, t0_wall: float) -> None:
        """cpu.parquet: time_s (from T0, the middle of each interval), client_cores,
        client_max_cores, busy_cores (the host's, client included), steal_cores, cpu_wait_share
        (the share of the interval in which some task waited for a CPU: PSI; NaN without it);
        ncpu in the metadata; nothing when nothing was sampled."""
        if not self.rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq
        t, *cores = zip(*self.rows)
        names = ("client_cores", "client_max_cores", "busy_cores", "steal_cores", "cpu_wait_share")
        table = pa.table({"time_s": pa.array([x - t0_wall for x in t], pa.float64()),
                          **{name: pa.array(col, pa.float32()) for name, col in zip(names, cores)}})
        pq.write_table(table.replace_schema_metadata({"ncpu": str(self.ncpu), "period_s": str(self.period)}),
                       Path(run_dir) / "cpu.parquet")


def supervise(config, nice: int | None = None, realtime: bool = False, looks=None):
    """Run the runner to its end beside the scraper, forwarding signals and sampling the CPU.
    Returns (the runner's exit code, the CpuSampler)."""
    from . import scrape
    from .output import update_run_json
    run_dir = Path(config.run_dir)
    root = str(Path(__file__).resolve().parents[1])
    # the scraper is ours: the runner's Output leaves it alone (scrape.OWNED)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), scrape.OWNED: "1"}
    prio = Priority(nice, realtime)
    prio.before_start()
    # our session (a new one is a CPU group of its own: Priority), its own process group:
    # Ctrl-C at a terminal reaches only us, and we forward it once
    scraper = scrape.start(run_dir)   # first: its imports are done by T0, its first sample before it
    child = subprocess.Popen([sys.executable, "-m", "llm_replay.replay.runner", str(run_dir)], env=env,
                             preexec_fn=prio.in_child)
    update_run_json(run_dir, scheduling=prio.after_start(child.pid))
    for err in prio.errors:
        print(f"replay: warning: {err}", file=sys.stderr)
    asked: list[float] = []   # when we forwarded a signal

    def forward(sig, _frame) -> None:
        asked.append(time.monotonic())
        child.send_signal(sig)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    sampler = CpuSampler(child.pid)   # while we wait anyway: the client's and the host's CPU
    grace = float(config.grace_s or 0)
    try:
        while True:
            try:
                rc = child.wait(timeout=min(max(0.0, sampler.due - time.monotonic()) if sampler.ok else 0.5,
                                             0.5 if looks is not None else 60.0))
                break
            except subprocess.TimeoutExpired:
                if sampler.ok:
                    sampler.sample()
                # decided with rows still to send: stop sending (a look over the last rows leaves the
                # runner to end by itself: a signal during its wrap-up would cost the records)
                if looks is not None and not asked and looks.look() and not looks.done.all():
                    update_run_json(run_dir, stop_reason="decided: the SLO gate reached its verdict")
                    forward(signal.SIGINT, None)
                # a runner stuck in a computation never sees the signal (its handler runs in its
                # event loop): after the grace and a margin it is killed, its records salvaged
                if asked and time.monotonic() > asked[0] + grace + STOP_MARGIN_S and child.poll() is None:
                    print(f"replay: the runner did not stop within {grace + STOP_MARGIN_S:g} s of the signal; "
                          "killing it (its flushed records are kept)", file=sys.stderr)
                    child.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        prio.restore()
        if scraper is not None:   # stdin closed: a last sample, then server_metrics.parquet
            scraper.stdin.close()
            try:
                scraper.wait(15)
            except subprocess.TimeoutExpired:
                scraper.kill()
    return rc, sampler


class RunInfo(dict):
    """run.json as the parent reads it once after the runner ended (the runner wrote t0_wall,
    status, status_counts...); `note` writes a change through to the file."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(json.loads((run_dir / "run.json").read_text()))
        self.dir = run_dir

    def note(self, **fields) -> None:
        from .output import update_run_json
        self.update(fields)
        update_run_json(self.dir, **fields)


def salvage_if_died(info: RunInfo, config, rc: int) -> int:
    """A runner that died (not 0, not 130 after a Ctrl-C): keep what it flushed, account for
    every other row; the run failed (1)."""
    if rc in (0, 130):
        return rc
    if info.get("status") in ("completed", "interrupted") and not (info.dir / "records.arrows").exists():
        # it wrote records.parquet and its status, then died on its way out (a stop signal that came
        # after its event loop had gone: the decided look's, racing the run's own end): the run is whole
        info.note(runner_exit=rc)
        return 130 if info["status"] == "interrupted" else 0
    from collections import Counter

    import pyarrow.parquet as pq
    from .recorder import salvage
    kept, added = salvage(info.dir, config, time.time() - info.get("t0_wall", time.time()))
    records = info.dir / "records.parquet"
    counts = Counter(pq.read_table(records, columns=["status"]).column("status").to_pylist()) if records.exists() else {}
    info.note(status="failed", runner_exit=rc, ended_wall=time.time(), status_counts=dict(sorted(counts.items())))
    print(f"replay: the runner exited with {rc}; {kept} records flushed before that were kept, "
          f"{added} rows without one recorded as cancelled/not_sent", file=sys.stderr)
    return 1


def finish_receiver(receiver, info: RunInfo, wait_s: float) -> None:
    if wait_s > 0:
        print(f"replay: waiting up to {wait_s:g} s for the server's last spans (--otlp-wait)", file=sys.stderr)
    o = receiver.finish(info.dir, wait_s, info)
    info.note(otlp=o)
    odd = "".join(f", {o[k]} {w}" for k, w in (("rejected", "with no credible span"), ("impossible", "impossible spans"),
                  ("unauthorized", "posts without the token"), ("over_limit", "spans over the limit")) if o.get(k))
    print(f"replay: otlp: {o['matched']} of {o['traced']} traced requests have a server span ({o['missing']} missing, "
          f"{o['unmatched']} spans of other traces, {o['late']} late, {o['bad_posts']} bad posts{odd}) -> "
          f"{info.dir / 'spans.parquet'}", file=sys.stderr)


def verdict(info: RunInfo, on_error: int | None, max_rate: float = MAX_ERROR_RATE) -> tuple[int, str]:
    """The exit code of a run that ended, and the line that states it. A run that lost a worker,
    or in which no request succeeded, did not complete: its status says so and the exit code is
    1; so is a completed one in which more than `max_rate` of the requests failed.
    `--exit-code-on-error N` (Locust's convention): N when any request failed."""
    counts = info.get("status_counts") or {}
    failed = sum(v for k, v in counts.items() if k != "ok")
    if info.get("lost_workers"):
        info.note(status="worker_lost")
        print(f"replay: worker(s) {', '.join(map(str, info['lost_workers']))} lost during the run: their rows are "
              "cancelled/not_sent", file=sys.stderr)
        return 1, ""
    if counts and not counts.get("ok"):
        info.note(status="all_failed")
        return 1, ""
    total = sum(counts.values())
    if on_error is not None:
        code, rule = (on_error if failed else 0), f"--exit-code-on-error {on_error}"
    else:
        code, rule = int(bool(total) and failed / total > max_rate), f"--max-error-rate {max_rate:.0%}"
    share = f"{failed / total:.0%}" if total else "-"
    return code, f"{failed} of {total} requests failed ({share}; {rule}): exit {code}"


def until_verdict(info: RunInfo, looks, slo, code: int) -> tuple[int, str]:
    """--until-decided: the gate's exit code on the prefix the deciding look judged, and the last
    line: what was decided, at which look, with how many rows."""
    from llm_replay import reports
    looks.look()   # a run faster than the parent's polls: the looks it finished before
    info.note(until_decided=looks.record(stopped=code == 130), **({"status": "decided"} if code == 130 else {}))
    code = reports.evaluate_slo(info.dir, slo).exit_code
    u, counts = info.get("until_decided"), info.get("status_counts") or {}
    what = {0: "passed", 1: "failed"}.get(code, "undecided")
    how = f"decided at look {u['look']}" if u["decided"] else f"not decided within the budget ({u['look']} looks)"
    left = f"; {counts.get('not_sent', 0):,} rows not sent" if u["stopped"] else ""
    return code, (f"until decided: {what}, {how}: judged the first {u['judged_rows']:,} of {u['rows']:,} rows at "
                  f"{u['confidence_per_look']:.2%} (the looks' error rates sum to at most "
                  f"{1 - slo.confidence:.0%}){left}: exit {code}")


def summarize(info: RunInfo, slo, verdict_line: str) -> None:
    """The reports summary table (also written as summary.json/.md and report.html), the status and
    the verdict; a Ctrl-C meant for the run must not cost its summary (a second one skips it)."""
    from llm_replay import reports
    hits = []

    def late_ctrl_c(_sig, _frame):
        hits.append(1)
        if len(hits) > 1:
            raise KeyboardInterrupt
        print("replay: writing the summary (Ctrl-C again to skip it)", file=sys.stderr)
    old = signal.signal(signal.SIGINT, late_ctrl_c)
    try:
        if (info.dir / "records.parquet").exists():
            print(reports.format_summary(reports.summarize_run(info.dir, slo=slo)), end="")
        print(f"status: {info.get('status')}  " + "  ".join(f"{k} {v}" for k, v in (info.get("status_counts") or {}).items()))
        print(f"run directory: {info.dir}  (report.html, summary.json, summary.md)")
        if verdict_line:
            print(verdict_line)
    finally:
        signal.signal(signal.SIGINT, old)


def unwritable(run_dir: Path, e: OSError) -> str:
    """The one-line reason of a write that failed (ENOSPC, EFBIG, EDQUOT...), also put in run.json."""
    from .output import update_run_json
    why = f"cannot write {e.filename or run_dir}: {os.strerror(e.errno) if e.errno else e}"
    try:
        if json.loads((run_dir / "run.json").read_text()).get("status") not in (None, "running"):
            return f"{why}; the run itself ended and its records are kept: `replay report {run_dir}` when there is room"
        update_run_json(run_dir, status="failed", error=why)
    except (OSError, ValueError):
        pass
    return f"{why}; the run in {run_dir} did not complete"
