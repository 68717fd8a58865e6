"""summary.json `connections`: which requests paid a connection set-up, and what it cost them.

A record's `connect_s` is how long its new connection took to open (TCP connect, plus the TLS
handshake for https); null when it was sent on a kept-alive connection. `sent_s` is stamped
after the connect, so TTFT never contains it: what a burst of new connections does to TTFT is
the server's side of it (accepting, handshaking, a cold socket), which the section shows as TTFT
on new against reused connections, and warns about when the new ones' tail is much worse.
"""
from __future__ import annotations

import numpy as np

from .metrics import as_f64
from .stats import describe

TAIL_FACTOR = 2.0    # warn when TTFT p99 on new connections is more than this x the reused ones'
TAIL_GAP_MS = 10.0   # ... and more than this many ms higher


def _stats(x: np.ndarray, keys=("p50", "p99")) -> dict:
    d = describe(x, ci=())
    return {"n": d["n"], **{k: d[k] for k in keys}}


def peak_per_second(times: np.ndarray) -> int:
    """The most of `times` (seconds, NaN ignored) within any one-second window."""
    ts = np.sort(times[~np.isnan(times)])
    if not len(ts):
        return 0
    return int((np.searchsorted(ts, ts + 1.0, side="left") - np.arange(len(ts))).max())


def connections(an, config: dict | None = None) -> dict:
    """The `connections` section for the measured rows of `an` (reports.analysis.Analysis).
    `config`: run.json, whose run config says the records carry connect_s even when every
    request reused a connection (older runs and imported results do not: `recorded` false)."""
    rm, m = an.rm, an.mask
    t = an.table
    c = as_f64(t.column("connect_s")) if "connect_s" in t.column_names else np.full(rm.n, np.nan)
    new = ~np.isnan(c)
    run_config = config.get("config") if isinstance(config, dict) else None
    recorded = bool(new.any()) or (isinstance(run_config, dict) and "preconnect" in run_config)
    empty = {"n": 0, "p50": None, "p99": None}
    if not recorded:
        return {"recorded": False, "opened": None, "reused": None, "peak_opened_per_s": None,
                "connect_ms": {**empty, "max": None}, "ttft_ms": {"new": empty, "reused": empty}, "warning": None}
    opened = m & new
    reused = m & ~new & ~np.isnan(rm.sent)
    ttft = rm.columns["ttft_ms"]
    # when each connection was opened: its request's send less the set-up (schedule if never sent)
    when = np.where(np.isnan(rm.sent), rm.scheduled, rm.sent - np.nan_to_num(c))[opened]
    out = {"recorded": True, "opened": int(np.count_nonzero(opened)), "reused": int(np.count_nonzero(reused)),
           "peak_opened_per_s": peak_per_second(when),
           "connect_ms": _stats(c[opened] * 1e3, ("p50", "p99", "max")),
           "ttft_ms": {"new": _stats(ttft[opened]), "reused": _stats(ttft[reused])}, "warning": None}
    p_new, p_old = out["ttft_ms"]["new"]["p99"], out["ttft_ms"]["reused"]["p99"]
    if p_new is not None and p_old is not None and p_new > TAIL_FACTOR * p_old and p_new - p_old > TAIL_GAP_MS:
        n = out["peak_opened_per_s"] or out["opened"]
        out["warning"] = (f"{out['opened']:,} requests paid a connection set-up (connect p99 "
                          f"{out['connect_ms']['p99']:.1f} ms): their TTFT p99 was {p_new:.1f} ms against "
                          f"{p_old:.1f} ms on kept-alive connections; open connections before T0 with "
                          f"`--preconnect {n}` (the most opened within one second)")
    return out
