"""Steady state by change points (docs/verdicts.md#steady-state): warm-up and level shifts found in
windowed latency and throughput, and the window a gate judges by default.

The run is cut, in send order, into windows of equal request counts (at least PER_WINDOW each, at
most MAX_WINDOWS). Three series: the log median TTFT and the log median TPOT of the window's
successes, and the log share of its requests that completed within the window's own time span
(about 1 while the server keeps up, falling when it saturates). On each series, optimal
partitioning (Jackson et al. 2005: the exact minimum of a piecewise-constant fit's squared error
plus a penalty per change; PELT computes the same search faster) with a penalty of
5 sigma^2 log(windows) (a BIC penalty made stricter: no cut in 200 stationary runs), sigma from the
median absolute first difference (robust to the shifts themselves); adjacent segments closer than
MIN_SHIFT are merged, since a 10 % wobble is noise to a gate, not a state. The change points of
all series together cut the run into segments.

The steady window is the last segment when it holds at least half of the windows: the state the
system settled into; what comes before it is warm-up (or an earlier state). A last segment shorter
than that (latency still moving at the end, several shifts) is "no steady state", and the whole run
is judged, so saying so. Runs under MIN_REQUESTS requests are not segmented: too few windows to
tell a shift from noise.
"""
from __future__ import annotations

import numpy as np

from .window import time_basis

PER_WINDOW, MAX_WINDOWS, MIN_WINDOWS = 20, 60, 8
MIN_REQUESTS = PER_WINDOW * MIN_WINDOWS
MIN_SHIFT = np.log(1.25)    # segments whose levels differ by less than 25 % are one
MIN_SEGMENT = 4             # windows
METHOD = ("optimal partitioning of windowed log medians (TTFT, TPOT) and completed share, "
          "penalty 5 sigma^2 log(windows), shifts under 25 % merged")


def partition(y: np.ndarray, penalty: float, min_seg: int = MIN_SEGMENT) -> list[int]:
    """The change points (segment starts after the first) minimising the squared error of a
    piecewise-constant fit plus `penalty` per change, segments at least `min_seg` long."""
    n = len(y)
    c1, c2 = np.concatenate([[0.0], np.cumsum(y)]), np.concatenate([[0.0], np.cumsum(y * y)])
    best, last = np.full(n + 1, np.inf), np.zeros(n + 1, dtype=int)
    best[0] = -penalty
    for j in range(min_seg, n + 1):
        i = np.array([0, *range(min_seg, j - min_seg + 1)])
        cost = best[i] + (c2[j] - c2[i]) - (c1[j] - c1[i]) ** 2 / (j - i) + penalty
        k = int(np.argmin(cost))
        best[j], last[j] = cost[k], i[k]
    cuts, j = [], n
    while j > 0:
        j = last[j]
        if j > 0:
            cuts.append(j)
    return sorted(cuts)


def _merge(y: np.ndarray, cuts: list[int]) -> list[int]:
    """Drop change points between segments whose mean levels differ by less than MIN_SHIFT."""
    while True:
        edges = [0, *cuts, len(y)]
        means = [float(np.mean(y[a:b])) for a, b in zip(edges, edges[1:])]
        gaps = [abs(b - a) for a, b in zip(means, means[1:])]
        if not gaps or min(gaps) >= MIN_SHIFT:
            return cuts
        cuts = cuts[:int(np.argmin(gaps))] + cuts[int(np.argmin(gaps)) + 1:]


def _changes(y: np.ndarray) -> list[int]:
    ok = np.isfinite(y)
    if ok.sum() < 2 * MIN_SEGMENT:
        return []
    y = np.where(ok, y, np.nanmedian(y))
    d = np.diff(y)
    # At least 0.02: a flat series (a stub server) has sigma 0, and shifts under MIN_SHIFT merge anyway.
    sigma = max(1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2), 0.02)
    return _merge(y, partition(y, 5 * sigma ** 2 * np.log(len(y))))


def _median(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.log(np.median(x))) if len(x) and np.median(x) > 0 else np.nan


def steady_window(basis: np.ndarray, ok: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, sent: np.ndarray,
                  end: np.ndarray, mask: np.ndarray) -> dict | None:
    """The run's segments and steady window over the `mask` rows placed in time by `basis`;
    None when the run is too short to segment."""
    rows = np.flatnonzero(mask & np.isfinite(basis))
    if len(rows) < MIN_REQUESTS:
        return None
    rows = rows[np.argsort(basis[rows], kind="stable")]
    w = min(MAX_WINDOWS, len(rows) // PER_WINDOW)
    parts = np.array_split(rows, w)
    series = {"ttft_ms": [], "tpot_ms": [], "completed_share": []}
    for p in parts:
        good = p[ok[p]]
        series["ttft_ms"].append(_median(ttft[good]))
        series["tpot_ms"].append(_median(tpot[good]))
        s = sent[p][np.isfinite(sent[p])]
        done = np.count_nonzero((end[p] >= s.min()) & (end[p] <= s.max())) if len(s) else 0
        series["completed_share"].append(np.log(max(done, 1) / len(p)))
    cuts = sorted({c for y in series.values() for c in _changes(np.array(y, float))})
    starts = [float(basis[p[0]]) for p in parts]
    edges = [0, *cuts, w]
    segs = [{"start_s": starts[a], "windows": b - a, "requests": int(sum(len(p) for p in parts[a:b])),
             "ttft_ms_p50": float(np.exp(np.nanmedian(series["ttft_ms"][a:b])))
             if np.isfinite(series["ttft_ms"][a:b]).any() else None} for a, b in zip(edges, edges[1:])]
    out = {"method": METHOD, "windows": w, "change_points_s": [starts[c] for c in cuts], "segments": segs,
           "steady": None, "reason": None}
    if not cuts:
        out["steady"] = {"start_s": starts[0], "requests": len(rows), "whole_run": True}
    elif segs[-1]["windows"] * 2 >= w:
        out["steady"] = {"start_s": segs[-1]["start_s"], "requests": segs[-1]["requests"], "whole_run": False}
    else:
        out["reason"] = (f"{len(cuts)} level shift(s) and the last segment holds {segs[-1]['windows']} of {w} "
                         "windows: latency or throughput still moving")
    return out


def of_run(an) -> dict | None:
    """`steady_window` of an Analysis over its measured rows (None when windows were chosen by hand:
    --warmup, --cooldown, --steady-state, or too few requests)."""
    if any(an.window.get(k) for k in ("warmup", "cooldown", "steady_state")):
        return None
    rm = an.rm
    return steady_window(time_basis(rm), rm.ok, rm.columns["ttft_ms"], rm.columns["tpot_ms"], rm.sent, rm.end, an.mask)


def judged_window(an, found: dict | None) -> tuple[np.ndarray, str | None]:
    """The gate's rows (the steady window when the run has one after a shift) and the note naming them."""
    if found is None:
        return an.mask, None
    st = found["steady"]
    if st is None:
        return an.mask, f"no steady state ({found['reason']}): judged the whole run"
    if st["whole_run"]:
        return an.mask, f"steady throughout (no level shift over {found['windows']} windows): judged the whole run"
    cuts = ", ".join(f"{c:.3g}" for c in found["change_points_s"])
    return an.mask & (time_basis(an.rm) >= st["start_s"]), (
        f"judged the steady window from {st['start_s']:.4g} s ({st['requests']:,} requests; level shifts at {cuts} s, "
        "the earlier requests are warm-up or an earlier state; --whole-run judges every request)")
