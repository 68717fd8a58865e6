"""Did the replay keep its schedule, and if not, whose fault was it: the client's or the host's?

A send more than LATE_MS after its scheduled time is late; when more than BOTTLENECK_SHARE of
the sends are, the replay fell behind and the offered load was not the trace's. The cause is
read from the run's CPU samples (`cpu.parquet`, written by `replay run` beside its runner):
- client: in the 0.1 s intervals of the late sends a client process used >= CLIENT_BUSY of a
  core (each runner process is one event loop): add workers or lower the rate;
- host: the hypervisor stole >= STEAL_BUSY cores (steal), or the cores were contended while the
  client was not busy (every core busy, or tasks waiting for a CPU WAITING of the time: other
  processes, such as a server on the same machine, held them): the client was not run.
Without samples the cause is unknown. The figures a cause taints are listed; the gate judges
them at both ends of the bias bound the late sends and their windows allow (bias.py), and says
"undecided" when that bound straddles a limit (`--as-measured`: as measured).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from .metrics import LATENCIES, SCHED_ALIAS
from .stats import describe

LATE_MS = 10.0            # a request sent more than this after its schedule is late
BOTTLENECK_SHARE = 0.01   # more than this share of late sends: the replay fell behind
CLIENT_BUSY = 0.8         # cores one client process used in an interval: saturated
STEAL_BUSY = 0.1          # cores stolen in an interval: the host stalled
WAITING = 0.1             # tasks waited for a CPU this share of an interval (PSI): 10 of 100 ms, enough
                          # to make a send LATE_MS late: the cores were contended
EXPLAINS = 0.25           # a cause present at this share of the late sends is named
CPU_FILE = "cpu.parquet"
# what a late send taints: the latencies from schedule (those that are not mere aliases) and the lag;
# the rates when fewer requests went out than the trace offered; every latency from `sent`
# when the host stalled (or the client stamped at read time)
SCHED = (*(m.replace("_ms", "_sched_ms") for m in LATENCIES if m.replace("_ms", "_sched_ms") not in SCHED_ALIAS),
         "lag_ms")
RATES = ("requests_per_s", "output_tokens_per_s", "goodput_rps", "token_goodput_per_s")
FROM_SENT = tuple(m for m in LATENCIES if m != "lag_ms")


def load_cpu(run_dir: str | Path | None) -> pa.Table | None:
    """The run's CPU samples, or None (none were taken, or the file is unreadable)."""
    path = Path(run_dir) / CPU_FILE if run_dir is not None else None
    if path is None or not path.exists():
        return None
    import pyarrow.parquet as pq
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError):
        return None


def _span_rate(times: np.ndarray) -> float | None:
    times = times[~np.isnan(times)]
    span = float(times.max() - times.min()) if len(times) > 1 else 0.0
    return len(times) / span if span > 0 else None


def assess(an, config: dict | None, cpu: pa.Table | None) -> dict:
    """The `dispatch_lag` section of summary.json: lag statistics, late share, offered and
    achieved rates, the cause and the late windows, and the figures it taints."""
    rm, m = an.rm, an.mask
    lag = rm.columns["lag_ms"][m]
    sent_rows = ~np.isnan(lag)
    lag = lag[sent_rows]
    out = describe(lag, ci=())
    out.pop("ci", None)
    late = lag > LATE_MS
    share = float(late.mean()) if len(lag) else None
    behind = bool(share is not None and share > BOTTLENECK_SHARE)
    offered, achieved = _span_rate(rm.scheduled[m]), _span_rate(rm.sent[m])
    out.update(late_threshold_ms=LATE_MS, late_share=share, behind_schedule=behind, offered_rps=offered,
               achieved_rps=achieved, client_bottleneck=False, cause=None, late_by_cause={}, windows=[], cpu=None,
               tainted=[], warning=None, stalls=None)
    if isinstance(config, dict):
        out["client"] = config.get("client")
        out["scheduling"] = config.get("scheduling")   # run.json: session, autogroup, nice (replay/priority.py)
    if cpu is not None and cpu.num_rows:
        out["cpu"] = _cpu_summary(cpu)
    if not behind:
        return out
    if out["cpu"] is not None:
        sched, sent = rm.scheduled[m][sent_rows][late], rm.sent[m][sent_rows][late]
        _attribute(out, cpu, sched, sent)
    cause = out["cause"]
    slow_rate = offered is not None and achieved is not None and achieved < 0.98 * offered
    tainted = list(SCHED) + (list(RATES) if slow_rate else [])
    read_stamps = str((config or {}).get("target") or "").startswith("https") if isinstance(config, dict) else False
    if cause is not None and ("host" in cause or (("client" in cause) and read_stamps)):
        tainted += FROM_SENT
    out["tainted"] = tainted
    out["client_bottleneck"] = cause is None or "client" in cause
    out["warning"] = _warning(out, slow_rate)
    from .bias import bias_of   # what the gate's bounds rest on
    b = bias_of(an, out)
    if b is not None:
        out["stalls"] = {"count": len(b.stalls), "stalled_s": round(b.stalled_s, 4),
                         "affected_requests": b.affected(m), "rate_factor": round(b.rate_factor, 4)}
    return out


def _cpu_summary(cpu: pa.Table) -> dict:
    col = {k: cpu.column(k).to_numpy() for k in ("client_cores", "client_max_cores", "busy_cores", "steal_cores")}
    meta = cpu.schema.metadata or {}
    return {"samples": cpu.num_rows, "ncpu": int(meta.get(b"ncpu", b"0")) or None,
            "client_cores_mean": float(col["client_cores"].mean()), "client_max_cores_p99": float(
                np.percentile(col["client_max_cores"], 99)), "steal_cores_mean": float(col["steal_cores"].mean()),
            "steal_cores_max": float(col["steal_cores"].max()), "busy_cores_mean": float(col["busy_cores"].mean())}


def _attribute(out: dict, cpu: pa.Table, sched: np.ndarray, sent: np.ndarray) -> None:
    """Name the cause of the late sends from the CPU samples of the intervals each one spanned
    (from its scheduled time to its send), and list the worst late windows."""
    t = cpu.column("time_s").to_numpy()
    period = float((cpu.schema.metadata or {}).get(b"period_s", b"0.1"))
    ncpu = out["cpu"]["ncpu"] or 1
    top, steal, busy = (cpu.column(k).to_numpy() for k in ("client_max_cores", "steal_cores", "busy_cores"))
    wait = cpu.column("cpu_wait_share").to_numpy() if "cpu_wait_share" in cpu.column_names else np.zeros(len(t))
    with np.errstate(invalid="ignore"):
        crowded = (busy >= ncpu - 0.15) | (wait >= WAITING)
    flags = {"client": top >= CLIENT_BUSY, "steal": steal >= STEAL_BUSY, "contention": crowded & (top < CLIENT_BUSY)}
    starts = t - period / 2
    lo = np.clip(np.searchsorted(starts, sched, side="right") - 1, 0, len(t) - 1)
    hi = np.clip(np.searchsorted(starts, sent, side="right"), 1, len(t))
    hi = np.maximum(hi, lo + 1)
    n = len(sched)
    hit = {}
    for name, f in flags.items():
        cs = np.concatenate([[0], np.cumsum(f)])
        hit[name] = (cs[hi] - cs[lo]) > 0
    host = hit["steal"] | hit["contention"]
    out["late_by_cause"] = {"client": int(hit["client"].sum()), "steal": int(hit["steal"].sum()),
                            "contention": int(hit["contention"].sum()),
                            "unexplained": int((~hit["client"] & ~host).sum())}
    named = [c for c, h in (("client", hit["client"]), ("host", host)) if n and h.mean() >= EXPLAINS]
    out["cause"] = "+".join(named) if named else "unexplained"
    # the worst windows: runs of consecutive intervals holding late sends
    per = np.bincount(lo, minlength=len(t))
    idx = np.flatnonzero(per)
    runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1) if len(idx) else []
    windows = []
    for r in sorted(runs, key=lambda r: -per[r].sum())[:10]:
        a, b = r[0], r[-1]
        causes = [c for c, f in (("client", flags["client"]), ("steal", flags["steal"]),
                                 ("contention", flags["contention"])) if f[a:b + 1].any()]
        windows.append({"start_s": float(starts[a]), "end_s": float(starts[b] + period), "late": int(per[r].sum()),
                        "client_max_cores": float(top[a:b + 1].max()), "steal_cores": float(steal[a:b + 1].max()),
                        "busy_cores": float(busy[a:b + 1].max()), "cause": "+".join(causes) or "unexplained"})
    out["windows"] = sorted(windows, key=lambda w: w["start_s"])


def _warning(out: dict, slow_rate: bool) -> str:
    late = (f"{out['late_share']:.1%} of requests were sent more than {LATE_MS:g} ms after their schedule "
            f"(p99 lag {out['p99']:.1f} ms, max {out['max']:.1f} ms)")
    rates = ""
    if out["offered_rps"] and out["achieved_rps"]:
        rates = f"; offered {out['offered_rps']:.4g} req/s by the trace, sent {out['achieved_rps']:.4g} req/s"
        if slow_rate:
            rates += " (the offered load was lower than the trace's)"
    cause, w = out["cause"], out["windows"]
    where = ""
    if w:
        shown = ", ".join(f"{x['start_s']:.1f}-{x['end_s']:.1f} s ({x['cause']})" for x in w[:3])
        where = f", mostly in {shown}"
    cpu = out["cpu"] or {}
    if cause is None:
        head = "the replay fell behind its schedule (no CPU samples of this run: the client or the host)"
        advice = "add workers or lower the rate if the client is saturated"
    elif cause == "client":
        head = "the client was the bottleneck"
        advice = "add workers (--workers) or lower the rate"
    elif cause == "host":
        by = out["late_by_cause"]
        why = [f"the hypervisor stole up to {cpu.get('steal_cores_max', 0):.2f} cores"] if by.get("steal") else []
        why += ["other processes held the cores while the client waited for one"] if by.get("contention") else []
        head = (f"the host stalled, not the client (the client used {cpu.get('client_cores_mean', 0):.2f} cores on "
                f"average; {' and '.join(why)})")
        advice = "the latencies of those windows include the stall; re-run on a quieter host, or give the client a core"
    elif cause == "client+host":
        head = "both the client and the host were the bottleneck"
        advice = "add workers, and re-run on a quieter host"
    else:
        head = "the replay fell behind its schedule, with neither the client nor the host visibly busy"
        advice = "look at the late windows in summary.json"
    sched = out.get("scheduling") or {}
    if sched.get("session") == "own":
        advice += "; the runner ran in a session of its own (its own CPU group under autogroups)"
    elif sched.get("policy") != "fifo" and "host" in (cause or ""):
        advice += "; `replay run --realtime` (root or CAP_SYS_NICE) lets the runner wake at once on a shared host"
    return (f"{head}: {late}{where}{rates}. {advice.capitalize()}; tainted (the gate judges them at both ends of "
            f"their bias bound): {', '.join(out['tainted'])}.")
