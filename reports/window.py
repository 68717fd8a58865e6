"""The measured window: warm-up / cool-down exclusion (by time or by count) and an optional
steady-state window (the longest span whose in-flight concurrency stays >= a fraction of peak).

Requests are placed in time by when the trace scheduled them (sent time where unknown), so the
window a replay measures does not depend on how the target behaved.
"""
from __future__ import annotations

import re

import numpy as np

from .errors import ReportError
from .metrics import RequestMetrics

_BOUND = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(s|r|req|requests)?\s*$")


def parse_bound(spec: object, name: str) -> tuple[str, float] | None:
    """'30s' or a float -> ('time', 30.0); '200', '200r' or an int -> ('count', 200)."""
    if spec is None or spec == "" or spec == 0:
        return None
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return ("count" if isinstance(spec, int) else "time", float(spec))
    m = _BOUND.match(str(spec))    # True too is neither a duration nor a count
    if not m:
        raise ReportError(f"expected a duration like '30s' or a request count like '200', got {spec!r}", field=name)
    value, unit = float(m.group(1)), m.group(2)
    if unit == "s":
        return ("time", value)
    if value != int(value):
        raise ReportError(f"a request count must be whole, got {spec!r}", field=name)
    return ("count", value)


def inflight(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-weighted mean number of requests in flight in each bin [edges[i], edges[i+1])."""
    keep = ~(np.isnan(start) | np.isnan(end))

    def counts_and_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """How many of x are <= each edge, and their sum (the sequential cumsum of sorted x):
        one copy, sorted and then summed in place."""
        v = x[keep]
        v.sort()
        k = np.searchsorted(v, edges, "right")
        np.cumsum(v, out=v)
        return k, np.where(k > 0, v[np.maximum(k - 1, 0)], 0.0) if len(v) else np.zeros(len(edges))

    ks, cs = counts_and_sums(start)   # integral of concurrency from -inf to t:
    ke, ce = counts_and_sums(end)     # sum over started of (t - s) minus over ended of (t - e)
    return np.diff((ks * edges - cs) - (ke * edges - ce)) / np.diff(edges)


def time_basis(rm: RequestMetrics) -> np.ndarray:
    """When each request is placed in time: its scheduled time, its sent time where unscheduled."""
    return np.where(np.isnan(rm.scheduled), rm.sent, rm.scheduled)


def _nth(basis: np.ndarray, k: int, largest: bool) -> float:
    """The k-th (0-based) smallest or largest time: the first one kept after excluding k."""
    valid = basis[~np.isnan(basis)]
    if k >= len(valid):
        return -np.inf if largest else np.inf
    return float(-np.partition(-valid, k)[k]) if largest else float(np.partition(valid, k)[k])


def steady_span(rm: RequestMetrics, frac: float, bin_s: float) -> tuple[float, float] | None:
    """Longest run of bins whose mean in-flight count is >= frac * the peak bin."""
    t0, t1 = np.nanmin(rm.sent), np.nanmax(rm.end)
    edges = np.arange(t0, t1 + bin_s, bin_s)
    if len(edges) < 2:
        return None
    conc = inflight(rm.sent, rm.end, edges)
    high = np.concatenate([[False], conc >= frac * conc.max(), [False]]).astype(np.int8)
    d = np.diff(high)
    starts, stops = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    best = int(np.argmax(stops - starts))
    return float(edges[starts[best]]), float(edges[stops[best]])


def select(rm: RequestMetrics, *, warmup=None, cooldown=None, steady_state: float | None = None,
           bin_s: float = 1.0) -> tuple[np.ndarray, dict]:
    """Mask of measured records and a description of the window for the summary."""
    basis = time_basis(rm)
    mask = np.ones(rm.n, dtype=bool)
    info: dict = {"warmup": None, "cooldown": None, "steady_state": None, "excluded": 0}
    if rm.n == 0 or np.isnan(basis).all():
        return mask, info
    t0, t1 = float(np.nanmin(basis)), float(np.nanmax(basis))
    for key, spec, is_start in (("warmup", warmup, True), ("cooldown", cooldown, False)):
        bound = parse_bound(spec, key)
        if bound is None:
            continue
        kind, value = bound
        cut = (t0 + value if is_start else t1 - value) if kind == "time" else _nth(basis, int(value), not is_start)
        mask &= (basis >= cut) if is_start else (basis <= cut)
        info[key] = {"by": kind, "value": value, "cut_s": cut if np.isfinite(cut) else None}
    if steady_state is not None:
        if not 0 < steady_state <= 1:
            raise ReportError(f"must be a fraction of peak concurrency in (0, 1], got {steady_state}",
                              field="steady_state")
        span = steady_span(rm, steady_state, bin_s) if np.isfinite(np.nanmax(rm.end)) else None
        if span is not None:
            mask &= (basis >= span[0]) & (basis < span[1])
            info["steady_state"] = {"fraction": steady_state, "start_s": span[0], "end_s": span[1]}
    info["excluded"] = int(rm.n - mask.sum())
    return mask, info
