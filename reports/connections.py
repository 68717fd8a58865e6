"""summary.json `connections`: which requests paid a connection set-up, and what it cost them.

A record's `connect_s` is how long its new connection took to open (TCP connect, plus the TLS
handshake for https); null when it was sent on a kept-alive connection. `sent_s` is stamped
after the connect, so TTFT never contains it: what a burst of new connections does to TTFT is
the server's side of it (accepting, handshaking, a cold socket), which the section shows as TTFT
on new against reused connections.

New connections are opened in bursts, when every kept-alive one is busy: exactly when the
server is busiest and queueing, so over the whole run their TTFT is worse even when the set-up
costs nothing. The warning therefore compares like with like: each new-connection request with
the requests on reused connections sent within half a second of it (its 1-s window; each new
request's window weighs the same), and warns only when the new ones' TTFT tail is much worse than
that of their window peers. A new request with no reused one in its window cannot be told apart
from queueing and is left out of the comparison.
"""
from __future__ import annotations

import numpy as np

from .metrics import as_f64
from .stats import describe

TAIL_FACTOR = 2.0    # warn when TTFT p99 on new connections is more than this x the reused ones'
TAIL_GAP_MS = 10.0   # ... and more than this many ms higher
MATCH_WINDOW_S = 1.0  # a new request's peers: reused ones sent within half of this of it
QUEUEING_NOTE = ("the slow first tokens on new connections are matched by reused ones sent in the same "
                 "seconds: server queueing, not connection set-up")


def _stats(x: np.ndarray, keys=("p50", "p99")) -> dict:
    d = describe(x, ci=())
    return {"n": d["n"], **{k: d[k] for k in keys}}


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float | None]:
    """Percentiles `qs` (0..100) of `values` weighted by `weights` (> 0): each value sits at the
    middle of its share of the total weight, linear in between, the ends held (equal weights give
    Hazen's percentiles, numpy's method="hazen"). None for no values."""
    if not len(values):
        return [None for _ in qs]
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    at = (np.cumsum(w) - w / 2) / w.sum()
    return [float(x) for x in np.interp(np.asarray(qs, dtype=np.float64) / 100, at, v)]


def window_peers(sent_new: np.ndarray, sent_reused: np.ndarray, window_s: float = MATCH_WINDOW_S):
    """For each new send, the slice [lo, hi) of the sorted reused sends within window_s / 2 of it;
    and each reused send's weight: the sum over the windows holding it of 1 / that window's size
    (0 exactly for one in no window)."""
    lo = np.searchsorted(sent_reused, sent_new - window_s / 2, side="left")
    hi = np.searchsorted(sent_reused, sent_new + window_s / 2, side="right")
    k = hi - lo
    has = k > 0
    step, held = np.zeros(len(sent_reused) + 1), np.zeros(len(sent_reused) + 1, np.int64)
    np.add.at(step, lo[has], 1.0 / k[has])
    np.add.at(step, hi[has], -1.0 / k[has])
    np.add.at(held, lo[has], 1)
    np.add.at(held, hi[has], -1)
    return lo, hi, np.where(np.cumsum(held)[:-1] > 0, np.cumsum(step)[:-1], 0.0)


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
                "connect_ms": {**empty, "max": None},
                "ttft_ms": {"new": empty, "reused": empty, "new_matched": empty, "reused_matched": empty,
                            "new_matched_excess": empty},
                "match_window_s": MATCH_WINDOW_S, "unmatched_new": None, "note": None, "warning": None}
    opened = m & new
    reused = m & ~new & ~np.isnan(rm.sent)
    ttft = rm.columns["ttft_ms"]
    # when each connection was opened: its request's send less the set-up (schedule if never sent)
    when = np.where(np.isnan(rm.sent), rm.scheduled, rm.sent - np.nan_to_num(c))[opened]
    out = {"recorded": True, "opened": int(np.count_nonzero(opened)), "reused": int(np.count_nonzero(reused)),
           "peak_opened_per_s": peak_per_second(when),
           "connect_ms": _stats(c[opened] * 1e3, ("p50", "p99", "max")),
           "ttft_ms": {"new": _stats(ttft[opened]), "reused": _stats(ttft[reused])},
           "match_window_s": MATCH_WINDOW_S, "unmatched_new": None, "note": None, "warning": None}
    out["ttft_ms"].update(_matched(rm.sent, ttft, opened, reused))
    tt = out["ttft_ms"]
    out["unmatched_new"] = tt["new"]["n"] - tt["new_matched"]["n"]
    p_new, p_old = tt["new_matched"]["p99"], tt["reused_matched"]["p99"]
    if _much_worse(p_new, p_old):
        n = out["peak_opened_per_s"] or out["opened"]
        out["warning"] = (f"{out['opened']:,} requests paid a connection set-up (connect p99 "
                          f"{out['connect_ms']['p99']:.1f} ms): their TTFT p99 was {p_new:.1f} ms against "
                          f"{p_old:.1f} ms on kept-alive connections sent in the same seconds "
                          f"({tt['new_matched']['n']:,} of them had such peers); open connections before T0 "
                          f"with `--preconnect {n}` (the most opened within one second)")
    elif _much_worse(tt["new"]["p99"], tt["reused"]["p99"]) and p_new is not None:
        out["note"] = QUEUEING_NOTE     # worse over the run, not within the same seconds
    return out


def _much_worse(p_new: float | None, p_old: float | None) -> bool:
    return p_new is not None and p_old is not None and p_new > TAIL_FACTOR * p_old and p_new - p_old > TAIL_GAP_MS


def _matched(sent: np.ndarray, ttft: np.ndarray, opened: np.ndarray, reused: np.ndarray) -> dict:
    """TTFT of the new-connection requests that had reused peers in their window (`new_matched`),
    of those peers (`reused_matched`: each new request's window weighs the same; n: distinct peers),
    and the difference at p50 and p99 (`new_matched_excess`; n: the new requests compared)."""
    new_i = np.flatnonzero(opened & ~np.isnan(ttft) & ~np.isnan(sent))
    old_i = np.flatnonzero(reused & ~np.isnan(ttft))
    old_i = old_i[np.argsort(sent[old_i], kind="stable")]
    lo, hi, weight = window_peers(sent[new_i], sent[old_i])
    new_m = new_i[hi > lo]
    peer = weight > 0
    ref = weighted_quantiles(ttft[old_i][peer], weight[peer], (50, 99))
    nm = _stats(ttft[new_m])
    excess = {"n": len(new_m), "p50": None, "p99": None}
    if len(new_m):
        excess.update(p50=nm["p50"] - ref[0], p99=nm["p99"] - ref[1])
    return {"new_matched": nm, "reused_matched": {"n": int(np.count_nonzero(peer)), "p50": ref[0], "p99": ref[1]},
            "new_matched_excess": excess}
