"""Did the replay keep its schedule; if not, whose fault was it (the client's or the host's), and
how far can that have moved each figure (the gate's bounds).

A send more than LATE_MS after its scheduled time is late; when more than BOTTLENECK_SHARE of
the sends are, the replay fell behind and the offered load was not the trace's. The cause is
read from the run's CPU samples (`cpu.parquet`, written by `replay run` beside its runner):
- client: in the 0.1 s intervals of the late sends a client process used >= CLIENT_BUSY of a
  core (each runner process is one event loop): add workers or lower the rate;
- host: the hypervisor stole >= STEAL_BUSY cores (steal), or the cores were contended while the
  client was not busy (every core busy, or tasks waiting for a CPU WAITING of the time: other
  processes, such as a server on the same machine, held them): the client was not run.
Without samples the cause is unknown. The figures a cause taints are listed; the gate judges
them at both ends of their bias bound, and says "undecided" when that bound straddles a limit
(`--as-measured`: as measured).

The bias bound. A late send is direct evidence that the client did not run when it should have
(its own core was saturated, or the host did not schedule it). While it did not run, it also
read nothing: a token that arrived then was stamped when the client ran again, late by at most
the stall (kernel timestamps do not help when one late read drains several events). So:
- the stalls are the intervals [scheduled, sent] of the late sends (lag > LATE_MS), joined
  with the CPU-sample windows that hold them (`assess` `windows`, 0.1 s grid);
- a stamp t inside a stall [a, b] (or within SETTLE after it: the read that ends it) may be
  late by up to t - a; a stamp outside every stall is on time. A send stamped in or just before
  a stall may have been written only at its end: up to b - sent more in every latency from it;
- so TTFT and E2E lie in [x - b, x] (b: that send delay plus the stamp's own); TPOT, whose two
  stamps can both be late, in [x - d_last/(k-1), x + d_first/(k-1)]; a gap between two token
  stamps in [max(0, g - d_k), g + d_(k-1)]; the `_sched` latencies, which also hold a late
  send's lag, in [x - lag - b, x]; other latencies, by the stalled time inside the request;
- when fewer requests went out than the trace offered, the rates lie in
  [x, x * offered / achieved].
The dispatch lag itself is measured exactly and has no bound. A stall that no send fell in is
not seen: at 20 req/s sends are 50 ms apart, so what is missed is shorter than that.
The gate takes the statistic of the lower and of the upper sample: pass when even the worst
end passes, fail when even the best end fails, undecided in between.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from .metrics import LATENCIES, SCHED_ALIAS, chunk_token_rows, token_gaps
from .stats import describe

LATE_MS = 10.0            # a request sent more than this after its schedule is late
BOTTLENECK_SHARE = 0.01   # more than this share of late sends: the replay fell behind
CLIENT_BUSY = 0.8         # cores one client process used in an interval: saturated
STEAL_BUSY = 0.1          # cores stolen in an interval: the host stalled
WAITING = 0.1             # tasks waited for a CPU this share of an interval (PSI): 10 of 100 ms, enough
                          # to make a send LATE_MS late: the cores were contended
EXPLAINS = 0.25           # a cause present at this share of the late sends is named
CPU_FILE = "cpu.parquet"
SETTLE = LATE_MS / 1e3    # a stamp this soon after a stall may be the read that ended it
# what a late send taints: the latencies from schedule (those that are not mere aliases) and the lag;
# the rates when fewer requests went out than the trace offered; every latency from `sent`
# when the host stalled (or the client stamped at read time)
SCHED = (*(s for s in (m.replace("_ms", "_sched_ms") for m in LATENCIES) if s not in SCHED_ALIAS), "lag_ms")
RATES = ("requests_per_s", "output_tokens_per_s", "goodput_rps", "token_goodput_per_s")
FROM_SENT = tuple(m for m in LATENCIES if m != "lag_ms")


def load_cpu(run_dir: str | Path | None) -> pa.Table | None:
    """The run's CPU samples, or None (none were taken, or the file is unreadable)."""
    import pyarrow.parquet as pq
    try:
        return pq.read_table(Path(run_dir) / CPU_FILE) if run_dir is not None else None
    except (pa.ArrowException, OSError):     # none taken (FileNotFoundError), or unreadable
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
    if isinstance(config, dict):   # run.json's scheduling: session, autogroup, nice (replay/parent.py)
        out.update(client=config.get("client"), scheduling=config.get("scheduling"))
    if cpu is not None and cpu.num_rows:
        out["cpu"] = _cpu_summary(cpu)
    if not behind:
        return out
    if out["cpu"] is not None:
        _attribute(out, cpu, rm.scheduled[m][sent_rows][late], rm.sent[m][sent_rows][late])
    cause = out["cause"]
    slow_rate = offered is not None and achieved is not None and achieved < 0.98 * offered
    read_stamps = isinstance(config, dict) and str(config.get("target") or "").startswith("https")
    from_sent = cause is not None and ("host" in cause or ("client" in cause and read_stamps))
    out["tainted"] = [*SCHED, *(RATES if slow_rate else ()), *(FROM_SENT if from_sent else ())]
    out["client_bottleneck"] = cause is None or "client" in cause
    out["warning"] = _warning(out, slow_rate)
    b = bias_of(an, out)   # what the gate's bounds rest on
    if b is not None:
        out["stalls"] = {"count": len(b.stalls), "stalled_s": round(b.stalled_s, 4),
                         "affected_requests": b.affected(m), "rate_factor": round(b.rate_factor, 4)}
    return out


def _cpu_summary(cpu: pa.Table) -> dict:
    col = {k: cpu.column(k).to_numpy() for k in ("client_cores", "client_max_cores", "busy_cores", "steal_cores")}
    return {"samples": cpu.num_rows, "ncpu": int((cpu.schema.metadata or {}).get(b"ncpu", b"0")) or None,
            "client_cores_mean": float(col["client_cores"].mean()),
            "client_max_cores_p99": float(np.percentile(col["client_max_cores"], 99)),
            "steal_cores_mean": float(col["steal_cores"].mean()), "steal_cores_max": float(col["steal_cores"].max()),
            "busy_cores_mean": float(col["busy_cores"].mean())}


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
    hi = np.maximum(np.clip(np.searchsorted(starts, sent, side="right"), 1, len(t)), lo + 1)
    hit = {name: (cs := np.concatenate([[0], np.cumsum(f)]))[hi] > cs[lo] for name, f in flags.items()}
    host = hit["steal"] | hit["contention"]
    out["late_by_cause"] = {**{k: int(h.sum()) for k, h in hit.items()},
                            "unexplained": int((~hit["client"] & ~host).sum())}
    named = [c for c, h in (("client", hit["client"]), ("host", host)) if len(sched) and h.mean() >= EXPLAINS]
    out["cause"] = "+".join(named) if named else "unexplained"
    # the worst windows: runs of consecutive intervals holding late sends
    per = np.bincount(lo, minlength=len(t))
    idx = np.flatnonzero(per)
    runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1) if len(idx) else []
    out["windows"] = [{"start_s": float(starts[r[0]]), "end_s": float(starts[r[-1]] + period),
                       "late": int(per[r].sum()), "client_max_cores": float(top[r].max()),
                       "steal_cores": float(steal[r].max()), "busy_cores": float(busy[r].max()),
                       "cause": "+".join(c for c, f in flags.items() if f[r].any()) or "unexplained"}
                      for r in sorted(sorted(runs, key=lambda r: -per[r].sum())[:10], key=lambda r: r[0])]


def _warning(out: dict, slow_rate: bool) -> str:
    late = (f"{out['late_share']:.1%} of requests were sent more than {LATE_MS:g} ms after their schedule "
            f"(p99 lag {out['p99']:.1f} ms, max {out['max']:.1f} ms)")
    rates = (f"; offered {out['offered_rps']:.4g} req/s by the trace, sent {out['achieved_rps']:.4g} req/s"
             + (" (the offered load was lower than the trace's)" if slow_rate else "")
             if out["offered_rps"] and out["achieved_rps"] else "")
    cause = out["cause"]
    shown = [f"{x['start_s']:.1f}-{x['end_s']:.1f} s ({x['cause']})" for x in out["windows"][:3]]
    where = f", mostly in {', '.join(shown)}" if shown else ""
    cpu, by = out["cpu"] or {}, out["late_by_cause"]
    why = [f"the hypervisor stole up to {cpu.get('steal_cores_max', 0):.2f} cores"] if by.get("steal") else []
    why += ["other processes held the cores while the client waited for one"] if by.get("contention") else []
    head, advice = {
        None: ("the replay fell behind its schedule (no CPU samples of this run: the client or the host)",
               "add workers or lower the rate if the client is saturated"),
        "client": ("the client was the bottleneck", "add workers (--workers) or lower the rate"),
        "host": (f"the host stalled, not the client (the client used {cpu.get('client_cores_mean', 0):.2f} cores "
                 f"on average; {' and '.join(why)})", "the latencies of those windows include the stall; re-run on "
                 "a quieter host, or give the client a core"),
        "client+host": ("both the client and the host were the bottleneck",
                        "add workers, and re-run on a quieter host"),
    }.get(cause, ("the replay fell behind its schedule, with neither the client nor the host visibly busy",
                  "look at the late windows in summary.json"))
    sched = out.get("scheduling") or {}
    if sched.get("session") == "own":
        advice += "; the runner ran in a session of its own (its own CPU group under autogroups)"
    elif sched.get("policy") != "fifo" and "host" in (cause or ""):
        advice += "; `replay run --realtime` (root or CAP_SYS_NICE) lets the runner wake at once on a shared host"
    return (f"{head}: {late}{where}{rates}. {advice.capitalize()}; tainted (the gate judges them at both ends of "
            f"their bias bound): {', '.join(out['tainted'])}.")


@dataclass
class Bias:
    stalls: np.ndarray        # (k, 2) merged stall intervals, seconds from T0
    send: np.ndarray          # per row, ms: how much later than stamped the request may have been written
    lag: np.ndarray           # per row, ms: the lag of a late send (0 when on time)
    d_first: np.ndarray       # per row, ms: how late its first-token stamp may be
    d_end: np.ndarray         # per row, ms: how late its last stamp may be
    overlap: np.ndarray       # per row, ms: stalled time in [scheduled, end] (the other latencies)
    rate_factor: float        # offered / achieved when fewer went out than offered, else 1

    @property
    def stalled_s(self) -> float:
        return float((self.stalls[:, 1] - self.stalls[:, 0]).sum()) if len(self.stalls) else 0.0

    def affected(self, rows: np.ndarray) -> int:
        return int(np.count_nonzero(rows & (self.overlap > 0)))

    def delay(self, t: np.ndarray) -> np.ndarray:
        """ms by which stamps at `t` (seconds from T0) may be late."""
        a, b = self.stalls[:, 0], self.stalls[:, 1]
        j, some = _last_stall(a, t)
        return np.where(some & (t <= b[j] + SETTLE), (t - a[j]) * 1e3, 0.0)

    def sample_bounds(self, metric: str, rm, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(lower, upper) samples of a per-request metric over `rows` (NaN dropped alike), or
        None when the metric carries no bias (the lag, or nothing stalled)."""
        base = metric.replace("_sched_ms", "_ms")
        if base == "lag_ms":
            return None
        x = rm.latency(metric)[rows]
        keep = ~np.isnan(x)
        x = x[keep]
        sched = metric.endswith("_sched_ms") and rm.latency(metric) is not rm.columns[base]
        pick = (lambda v: v[rows][keep])
        send, d_first, d_end = pick(self.send), pick(self.d_first), pick(self.d_end)
        extra = pick(self.lag) if sched else 0.0
        if base == "ttft_ms":
            lo, hi = x - send - d_first - extra, x
        elif base == "e2e_ms":
            lo, hi = x - send - d_end - extra, x
        elif base == "tpot_ms":
            k = np.maximum(pick(rm.n_out) - 1, 1)
            lo, hi = x - d_end / k, x + d_first / k
        elif base == "ntpot_ms":
            k = np.maximum(pick(rm.n_out), 1)
            lo, hi = x - (send + d_end + extra) / k, x
        else:
            b = pick(self.overlap)
            lo, hi = x - b, x + b
        if np.array_equal(lo, x) and np.array_equal(hi, x):
            return None
        return np.maximum(lo, 0), hi

    def pooled_bounds(self, an, metric: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Token gaps of the requests with a stamp in a stall, each by its own two stamps' delays
        (chunk gaps of one token each); otherwise by the request's stalled time either way."""
        base = metric.replace("_sched_ms", "_ms")
        hit = rows & (self.overlap > 0)
        if not hit.any():
            return None
        clean, dirty = an.pooled(rows & ~hit)[base], an.pooled(hit)[base]
        per_gap = base == "icl_ms" or (base == "itl_ms" and (an.rm.one_token[hit] | ~an.rm.ok[hit]).all()
                                       and not chunk_token_rows(an.table, hit).any())
        if per_gap:
            idx = np.flatnonzero(hit & an.rm.ok)
            tt = an.table.column("token_times").take(idx).combine_chunks()
            lens = np.diff(tt.offsets.to_numpy())
            t = tt.values.to_numpy(zero_copy_only=False).astype(np.float64) + np.repeat(an.rm.sent[idx], lens)
            g, same = token_gaps(t, lens)
            g *= 1e3
            d = self.delay(t)
            g, lo, hi = g[same], (g - d[1:])[same], (g + d[:-1])[same]
            if len(g) == len(dirty):      # the same gaps pooled_gaps found (else: the safe bound)
                return np.concatenate([clean, np.maximum(lo, 0)]), np.concatenate([clean, hi])
        big = float(self.overlap[hit].max())
        return np.concatenate([clean, np.maximum(dirty - big, 0)]), np.concatenate([clean, dirty + big])

    def shifted(self, rm, upper: bool):
        """RequestMetrics with every biased per-request latency at its upper (or lower) end,
        for good requests (attainment, goodput) under the worst and best case."""
        cols = dict(rm.columns)
        for key in ("ttft_ms", "ttfa_ms", "tpot_ms", "e2e_ms"):
            b = self.sample_bounds(key, rm, np.ones(rm.n, bool))
            if b is not None:
                cols[key] = col = cols[key].copy()
                col[~np.isnan(col)] = b[1] if upper else b[0]
        return replace(rm, columns=cols)


def _merge(iv: np.ndarray) -> np.ndarray:
    """Overlapping or touching intervals (start <= end) joined, by start."""
    if not len(iv):
        return np.zeros((0, 2))
    iv = iv[np.argsort(iv[:, 0])]
    first = np.flatnonzero(np.r_[True, iv[1:, 0] > np.maximum.accumulate(iv[:-1, 1])])   # of each joined one
    return np.column_stack([iv[first, 0], np.maximum.reduceat(iv[:, 1], first)])


def _last_stall(starts: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per t, the index of the last stall starting at or before it (0 when none), and whether there is one."""
    k = np.searchsorted(starts, np.nan_to_num(t, nan=-np.inf), side="right") - 1
    return np.maximum(k, 0), k >= 0


def _stalled_before(stalls: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Total stalled time (s) before each t (NaN -> NaN) in the (non-empty) stalls."""
    a, b = stalls[:, 0], stalls[:, 1]
    j, some = _last_stall(a, t)
    before = np.concatenate([[0.0], np.cumsum(b - a)])[j]     # the whole stalls before stall j
    out = np.where(some, before + np.maximum(np.minimum(t, b[j]) - a[j], 0.0), 0.0)
    return np.where(np.isnan(t), np.nan, out)


def bias_of(an, dispatch_lag: dict | None) -> Bias | None:
    """The bounds of a run from its records and its `dispatch_lag` section (`assess`);
    None when no send was late and the offered load was sent."""
    rm, m = an.rm, an.mask
    lag = (rm.sent - rm.scheduled) * 1e3
    late = m & (lag > LATE_MS)
    d = dispatch_lag or {}
    off, ach = d.get("offered_rps"), d.get("achieved_rps")
    factor = off / ach if off and ach and ach < 0.98 * off else 1.0
    if not late.any() and factor == 1.0:
        return None
    windows = np.asarray([[w["start_s"], w["end_s"]] for w in d.get("windows") or []], float).reshape(-1, 2)
    stalls = _merge(np.concatenate([np.column_stack([rm.scheduled[late], rm.sent[late]]), windows]))
    bias = Bias(stalls, *(np.zeros(rm.n) for _ in range(5)), factor)
    if not len(stalls):
        return bias
    j, some = _last_stall(stalls[:, 0], rm.sent + SETTLE)
    b = stalls[j, 1]
    bias.send = np.nan_to_num(np.where(some & (rm.sent <= b), np.maximum(b - rm.sent, 0) * 1e3, 0.0))
    bias.lag = np.where(late, lag, 0.0)
    bias.d_first = np.nan_to_num(bias.delay(rm.sent + rm.columns["ttft_ms"] / 1e3))
    bias.d_end = np.nan_to_num(bias.delay(rm.end))
    cum = _stalled_before(stalls, rm.end) - _stalled_before(stalls, rm.scheduled)
    bias.overlap = np.nan_to_num(np.maximum(cum, 0) * 1e3)
    return bias
