"""Fit distributions and arrival processes to samples (the pieces of `replay trace fit`).

- lengths (and think times, turns, batch sizes): lognormal / gamma / Weibull by AIC when the
  fitted p50/p90/p99 match the data, else an exact PMF or an empirical quantile table;
- the rate profile: windowed counts, kept as a table when the rate visibly varies;
- the arrival process on rate-rescaled gaps: batch when many arrivals coincide, a two-state
  MMPP (on/off) when the index of dispersion keeps growing with the window, else Poisson /
  gamma / Weibull by AIC with the gaps' CV.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import linalg, optimize
from scipy import stats as sst

from . import stats

FIT_SAMPLES = 200_000       # likelihoods on an evenly spaced subsample: fast on 10M rows
EMPIRICAL_POINTS = 1000


def _sub(x: np.ndarray) -> np.ndarray:
    return x[np.linspace(0, len(x) - 1, FIT_SAMPLES).astype(np.int64)] if len(x) > FIT_SAMPLES else x


def _candidates(x: np.ndarray) -> list[tuple[float, str, dict[str, float], Any]]:
    """(AIC, family, params, frozen scipy dist) of lognormal, gamma and Weibull fits (loc 0)."""
    x = _sub(x[x > 0])
    out = []
    lx = np.log(x)
    ln = sst.lognorm(max(lx.std(), 1e-6), scale=np.exp(lx.mean()))
    out.append(("lognormal", {"median": float(np.exp(lx.mean())), "sigma": float(lx.std())}, ln))
    k = stats.gamma_shape(x)
    if k:
        out.append(("gamma", {"shape": k, "scale": float(x.mean() / k)}, sst.gamma(k, scale=x.mean() / k)))
    c = stats.weibull_shape(x)
    if c:
        scale = float(np.mean(x ** c) ** (1 / c))
        out.append(("weibull", {"shape": c, "scale": scale}, sst.weibull_min(c, scale=scale)))
    return sorted((4 - 2 * float(np.sum(d.logpdf(x))), f, p, d) for f, p, d in out)


def fit_length(x: np.ndarray, integer: bool = True) -> dict[str, Any]:
    """A spec distribution for samples x: the best parametric family by AIC whose capped
    quantiles match the data within 3%, else an empirical quantile table."""
    x = np.asarray(x, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        return {"dist": "constant", "value": lo}
    qs = np.array([0.5, 0.9, 0.99])
    emp = np.quantile(x, qs)
    vals, counts = np.unique(x, return_counts=True)
    small_support = integer and len(vals) <= 64  # e.g. turns, batch sizes: keep the exact PMF
    for _, fam, params, d in ([] if small_support else _candidates(x)[:1]):
        fitted = np.clip(d.ppf(qs), lo, hi)
        fitted = np.rint(fitted) if integer else fitted
        if np.all(np.abs(fitted - emp) <= 0.03 * np.maximum(emp, 1)):
            return {"dist": fam, **{k: round(v, 6) for k, v in params.items()}, "min": lo, "max": hi}
    if len(vals) > EMPIRICAL_POINTS:
        vals = np.quantile(x, (np.arange(EMPIRICAL_POINTS) + 0.5) / EMPIRICAL_POINTS, method="inverted_cdf")
        counts = np.ones(len(vals))
    return {"dist": "empirical", "values": [float(v) for v in vals], "weights": [int(c) for c in counts],
            "min": lo, "max": hi}


def _idc(u: np.ndarray, w: float) -> float | None:
    """Index of dispersion of counts of points u in windows of width w."""
    nb = int(u[-1] // w) if len(u) else 0
    if nb < 10:
        return None
    c = np.bincount((u // w).astype(np.int64), minlength=nb)[:nb]
    return float(c.var(ddof=1) / c.mean()) if c.mean() > 0 else None


def fit_profile(t: np.ndarray, duration: float, window: float) -> tuple[dict[str, Any], np.ndarray]:
    """The rate profile and the arrivals in operational time (mean rate 1)."""
    nb = max(int(round(duration / window)), 1)  # a remainder under half a window joins the last
    counts = np.bincount(np.minimum((t // window).astype(np.int64), nb - 1), minlength=nb).astype(float)
    widths = np.full(nb, window)
    widths[-1] = duration - (nb - 1) * window
    dens = counts / widths
    varying = False
    if nb >= 6 and counts.mean() >= 5:
        lag1 = np.corrcoef(dens[:-1], dens[1:])[0, 1] if dens.std() > 0 else 0.0
        u_flat = t * len(t) / duration
        inner = _idc(u_flat, max(counts.mean() / 10, 1.0)) or 1.0
        varying = lag1 > 0.5 or (dens.var(ddof=1) * window / dens.mean() > 4 * inner + 2)
    if not varying:
        return {"kind": "constant"}, t * len(t) / duration
    knots = np.append(np.arange(nb) * window, duration)
    lam = np.concatenate([[0.0], np.cumsum(counts)])
    mean = dens.mean()
    values = [round(float(v / mean), 4) for v in dens]
    if widths[-1] > window:  # the generator's table is in whole windows: repeat the last value
        values.append(values[-1])
    return ({"kind": "table", "window": window, "values": values},
            np.interp(t, knots, lam))


def fit_arrival(u: np.ndarray, rate: float) -> dict[str, Any]:
    """Arrival process for points u in operational time (unit mean rate); `rate` in req/s."""
    g = np.diff(u)
    if len(g) < 20:
        return {"process": "poisson"}
    zero = float(np.mean(g <= 1e-9))
    if zero > 0.2:  # compound arrivals: many requests share an instant
        times, k = np.unique(u, return_counts=True)
        gaps = np.diff(times)
        return {"process": "batch", "cv": round(float(min(max(gaps.std() / gaps.mean(), 0.05), 20)), 4),
                "size": fit_length(k.astype(float))}
    g = g[g > 1e-9]
    cv = float(g.std() / g.mean())
    big = max(60 * rate, 20.0)
    idc_big, idc_small = _idc(u, big), _idc(u, max(rate, 1.0))
    if idc_big and idc_small and idc_big > 2 * max(cv * cv, 1) + 1 and idc_big > 2 * idc_small:
        return _fit_onoff(u, rate)
    best = _candidates(g)
    ll_exp = 2 - 2 * float(np.sum(sst.expon(scale=g.mean()).logpdf(_sub(g))))
    if ll_exp <= best[0][0] or abs(cv - 1) < 0.03:
        return {"process": "poisson"}
    fam = best[0][1] if best[0][1] in ("gamma", "weibull") else "gamma"
    return {"process": fam, "cv": round(min(max(cv, 0.05), 20.0), 4)}


def _mmpp_idc(w: np.ndarray, l1: float, l2: float, p1: float, rho: float) -> np.ndarray:
    """Index of dispersion of a two-state MMPP at window w (p1 = share of time bursting,
    rho = sum of the switching rates)."""
    m = p1 * l1 + (1 - p1) * l2
    return 1 + 2 * (l1 - l2) ** 2 * p1 * (1 - p1) / (m * rho) * (1 - (1 - np.exp(-rho * w)) / (rho * w))


def _mmpp_p0(b: float, l1: float, l2: float, p1: float, rho: float) -> float:
    """P(no arrival in a window of width b) = pi exp((Q - L) b) 1."""
    r_on, r_off = rho * (1 - p1), rho * p1           # leave burst, leave idle
    q = np.array([[-r_on - l1, r_on], [r_off, -r_off - l2]])
    return float(np.array([p1, 1 - p1]) @ linalg.expm(q * b) @ np.ones(2))


def _fit_onoff(u: np.ndarray, rate: float) -> dict[str, Any]:
    """Two-state MMPP by moments: its closed-form index of dispersion over a ladder of windows
    and the share of empty short windows, matched by least squares (unit mean rate)."""
    scales = np.geomspace(0.5, max(u[-1] / 30, 1.0), 14)
    idc = np.array([_idc(u, w) or np.nan for w in scales])
    ok = np.isfinite(idc) & (idc > 0)
    scales, idc = scales[ok], idc[ok]
    small = (0.3, 1.0)
    p0 = [float(np.mean(np.bincount((u // b).astype(np.int64))[: int(u[-1] // b)] == 0)) for b in small]

    def unpack(x: np.ndarray) -> tuple[float, float, float, float]:
        p1, ratio, rho = 1 / (1 + np.exp(-x[0])), 1 / (1 + np.exp(-x[1])), np.exp(x[2])
        l1 = 1 / (p1 + (1 - p1) * ratio)  # mean rate 1
        return l1, ratio * l1, p1, rho

    def resid(x: np.ndarray) -> np.ndarray:
        l1, l2, p1, rho = unpack(x)
        r = np.log(_mmpp_idc(scales, l1, l2, p1, rho)) - np.log(idc)
        return np.concatenate([r, [5 * (_mmpp_p0(b, l1, l2, p1, rho) - p) for b, p in zip(small, p0)]])

    best = min((optimize.least_squares(resid, x0) for x0 in
                ([-1.5, -2.5, np.log(0.05)], [0.0, -1.0, np.log(0.01)], [-3.0, -4.0, np.log(0.002)])),
               key=lambda r: r.cost)
    l1, l2, p1, rho = unpack(best.x)
    return {"process": "onoff", "burst_rate": round(l1 * rate, 6), "idle_rate": round(l2 * rate, 6),
            "on_s": round(1 / (rho * (1 - p1)) / rate, 4), "off_s": round(1 / (rho * p1) / rate, 4)}
