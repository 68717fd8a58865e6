"""The stimulus certificate: was the load the trace offered delivered to the server?

A verdict on a server says how it behaved under the trace's load; if the client did not send that
load, the verdict is about some other, lighter load. The certificate (summary.json `stimulus`, and
the gate's) holds, per window of WINDOW_S (longer for long runs: at most MAX_WINDOWS): the rows the
trace scheduled in it (offered) against the rows sent in it (achieved), and their send lag
(sent - scheduled); over the run: the lag p50/p99/max, the client's CPU headroom (cpu.parquet: the
busiest client process's share of its core; each runner process is one event loop), lost workers
(run.json `lost_workers`) and the measured rows never sent. `delivered` is false, with a reason
each, when
- a window that offered at least MIN_WINDOW_ROWS rows got fewer than RATE_SHARE of them sent in it,
  or the whole run fewer than RATE_SHARE of its offered rate (at least MIN_WINDOW_ROWS rows);
- the send lag p99 exceeded LAG_P99_MS or LAG_GAP_SHARE of the mean gap between offered rows,
  whichever is larger. Both bounds say "the arrival process moved by at most ~50 ms": a pure delay
  of 50 ms shifts 5 % of a 1 s window's rows into the next one. That is five times the late
  threshold the bias bound starts at (validity.LATE_MS) and above the 10-35 ms lag tails of a
  healthy replay on a noisy 2-core host (docs/performance.md), so a run that merely had a few late
  sends is judged by its bias bound, not refused. A sparse trace moves by its gaps: a send late by
  less than a quarter of the mean gap still reaches the server nearer its own slot than its
  neighbour's, so at 2 req/s a 66 ms stall of a busy host is not a lost stimulus;
- a worker was lost, or a measured row was not sent (a run until decided: only its judged rows);
- the busiest client process used at least SATURATED of its core in at least half of the CPU
  samples of the sending span: a client with no headroom sends on time only by luck.
Without run.json (a records file, an import from another tool) `delivered` is None, unknown: the
figures are given, nothing is refused.

The gate (gate.py): a run whose stimulus was not delivered cannot pass, it exits 2 with the
reasons. A failure stays a failure (exit 1): a figure that fails is judged at both ends of its
bias bound when the replay fell behind (validity.py, which also scales the rates by offered/achieved),
so it fails whichever end is true, and a server that fails under less load than asked would not
pass under more.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .schema import STATUSES
from .sequential import judged

WINDOW_S = 1.0          # window length (s)
MAX_WINDOWS = 120       # longer runs get longer windows
MIN_WINDOW_ROWS = 50    # a window offering fewer rows is listed, not judged (one row would be 2 % or more)
RATE_SHARE = 0.95       # rows sent in a window / rows offered in it, at least
LAG_P99_MS = 50.0       # send lag p99, at most (or LAG_GAP_SHARE of the mean gap if larger)
LAG_GAP_SHARE = 0.25
SATURATED = 0.95        # cores the busiest client process used in a 0.1 s sample: no headroom


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def certificate(an, config: dict | None, cpu: pa.Table | None) -> dict:
    """The `stimulus` section of summary.json over the measured rows (a run until decided: those
    its gate judged), from the analysis, run.json (`config`) and cpu.parquet (`cpu`)."""
    rm, looked = an.rm, judged(config)
    rows = an.mask & (rm.scheduled <= (looked[0] if looked else np.inf))   # False for NaN: imported, unscheduled
    sched, sent = rm.scheduled[rows], rm.sent[rows]
    went = ~np.isnan(sent)
    lag = (sent[went] - sched[went]) * 1e3
    not_sent = int(np.count_nonzero(rm.status_codes[rows] == STATUSES.index("not_sent")))
    lost = list((config or {}).get("lost_workers") or [])
    out = {"delivered": None, "reasons": [],
           "thresholds": {"window_s": WINDOW_S, "min_window_rows": MIN_WINDOW_ROWS, "rate_share": RATE_SHARE,
                          "lag_p99_ms": LAG_P99_MS, "saturated_cores": SATURATED},
           "rows": int(rows.sum()), "sent": int(went.sum()), "not_sent": not_sent, "lost_workers": lost,
           "offered_rps": None, "achieved_rps": None,
           "lag_ms": {"p50": _pct(lag, 50), "p99": _pct(lag, 99), "max": float(lag.max()) if len(lag) else None},
           "cpu": None, "windows": []}
    if not len(sched):
        return out
    t0, t1 = float(sched.min()), float(sched.max())
    end = max(t1, float(sent[went].max())) if went.any() else t1     # windows run on to the last send
    width = max(WINDOW_S, (end - t0) / MAX_WINDOWS)
    edges = t0 + width * np.arange(int((end - t0) // width) + 2)
    k = len(edges) - 1
    w_sched = np.clip(np.searchsorted(edges, sched, side="right") - 1, 0, k - 1)
    w_sent = np.clip(np.searchsorted(edges, sent[went], side="right") - 1, 0, k - 1)
    offered, achieved = np.bincount(w_sched, minlength=k), np.bincount(w_sent, minlength=k)
    span = t1 - t0
    sent_span = float(sent[went].max() - sent[went].min()) if went.sum() > 1 else 0.0
    out["offered_rps"] = len(sched) / span if span > 0 else None
    if len(sched) > 1 and span > 0:
        out["thresholds"]["lag_p99_ms"] = max(LAG_P99_MS, LAG_GAP_SHARE * 1e3 * span / (len(sched) - 1))
    out["achieved_rps"] = went.sum() / sent_span if sent_span > 0 else None
    top, lag_w = _client_top(cpu, t0, end), w_sched[went]
    for i in range(k):
        a, b = float(edges[i]), float(min(edges[i + 1], end))
        wl = lag[lag_w == i]
        w = {"start_s": a, "end_s": b, "offered": int(offered[i]), "sent": int(achieved[i]),
             "offered_rps": offered[i] / (b - a) if b > a else None,
             "achieved_rps": achieved[i] / (b - a) if b > a else None,
             "lag_p99_ms": _pct(wl, 99), "lag_max_ms": float(wl.max()) if len(wl) else None}
        if top is not None:
            sel = top[1][(top[0] >= a) & (top[0] < max(b, a + 0.1))]
            w["client_max_cores"] = float(sel.max()) if len(sel) else None
        out["windows"].append(w)
    if top is not None:
        tc, meta = top[1], (cpu.schema.metadata or {})
        out["cpu"] = {"samples": len(tc), "ncpu": int(meta.get(b"ncpu", b"0")) or None,
                      "client_cores_mean": float(cpu.column("client_cores").to_numpy().mean()),
                      "client_max_cores_p50": _pct(tc, 50), "client_max_cores_p99": _pct(tc, 99),
                      "headroom_cores": max(0.0, 1.0 - float(np.percentile(tc, 50))) if len(tc) else None}
    out["reasons"] = _reasons(out, offered, achieved, edges, lag, lost, not_sent)
    out["delivered"] = None if not isinstance(config, dict) else not out["reasons"]
    return out


def _client_top(cpu: pa.Table | None, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(time_s, client_max_cores) of the CPU samples from the first schedule to the last send."""
    if cpu is None or not cpu.num_rows or "client_max_cores" not in cpu.column_names:
        return None
    t, c = (cpu.column(k).to_numpy().astype(np.float64) for k in ("time_s", "client_max_cores"))
    sel = (t >= t0) & (t <= t1 + 0.1)
    return (t[sel], c[sel]) if sel.any() else None


def _reasons(out: dict, offered, achieved, edges, lag, lost, not_sent) -> list[str]:
    why = []
    judged_w = np.flatnonzero(offered >= MIN_WINDOW_ROWS)
    short = judged_w[achieved[judged_w] < RATE_SHARE * offered[judged_w]]
    if len(short):
        i = short[np.argmin(achieved[short] / offered[short])]
        why.append(f"{len(short)} of {len(judged_w)} windows of {edges[1] - edges[0]:.3g} s got less than "
                   f"{RATE_SHARE:.0%} of their offered rows sent (worst: {achieved[i]} of {offered[i]} at "
                   f"{edges[i]:.1f} s)")
    off, ach = out["offered_rps"], out["achieved_rps"]
    if out["rows"] >= MIN_WINDOW_ROWS and off and ach and ach < RATE_SHARE * off:
        why.append(f"sent {ach:.4g} req/s where the trace offered {off:.4g} req/s")
    p99, limit = out["lag_ms"]["p99"], out["thresholds"]["lag_p99_ms"]
    if p99 is not None and p99 > limit:
        why.append(f"send lag p99 {p99:.4g} ms > {limit:.4g} ms (max {out['lag_ms']['max']:.4g} ms)")
    if lost:
        why.append(f"worker(s) {', '.join(map(str, lost))} lost during the run")
    if not_sent:
        why.append(f"{not_sent:,} of {out['rows']:,} measured rows were not sent")
    cpu = out["cpu"]
    if cpu and cpu["client_max_cores_p50"] is not None and cpu["client_max_cores_p50"] >= SATURATED:
        why.append(f"the client was saturated: its busiest process used >= {SATURATED:g} of a core in half of "
                   f"the samples (median {cpu['client_max_cores_p50']:.2f})")
    return why


def sentence(cert: dict | None) -> str | None:
    """The gate's caption when the stimulus was not delivered, else None."""
    if not cert or cert.get("delivered") is not False:
        return None
    return "cannot pass: the stimulus was not delivered: " + "; ".join(cert["reasons"])
